"""The one toy model of scout's own jobs (scout/scenarios/toy.py): its flavours differ only
where asked, so the campaign, the benchmark and the replay tests run the same transformer."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from scout.scenarios.toy import TinyLM  # noqa: E402


def test_both_attentions_compute_the_same_function_on_the_same_weights() -> None:
    torch.manual_seed(0)
    explicit = TinyLM(64, 32, 4, 2).eval()
    torch.manual_seed(0)
    fused = TinyLM(64, 32, 4, 2, attention="sdpa").eval()
    tokens = torch.randint(0, 64, (3, 12))
    assert torch.allclose(explicit(tokens), fused(tokens), atol=1e-5)


def test_dropout_adds_a_module_and_nothing_else() -> None:
    plain, dropping = TinyLM(64, 32, 4, 2), TinyLM(64, 32, 4, 2, dropout=0.1)
    assert list(plain.state_dict()) == list(dropping.state_dict())
    extra = {name for name, _ in dropping.named_modules()} - {name for name, _ in plain.named_modules()}
    assert extra == {"layers.0.dropout", "layers.1.dropout"}


@pytest.mark.parametrize(("arguments", "match"), [
    ({"heads": 5}, "multiple of heads"),
    ({"attention": "flash"}, "not one of"),
])
def test_a_bad_shape_or_attention_is_refused_naming_it(arguments: dict[str, object], match: str) -> None:
    options: dict[str, object] = {"vocab": 64, "width": 32, "heads": 4, "layers": 1, **arguments}
    with pytest.raises(ValueError, match=match):
        TinyLM(**options)  # type: ignore[arg-type]
