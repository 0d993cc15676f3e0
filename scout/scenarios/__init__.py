"""Named simulated-cluster scenarios behind ``scout simulate``: the transport contract
(:mod:`.exchange`), the observers running their production driver (:mod:`.observer`) and the
checkpoint gate job-wide (:mod:`.gate_campaign`); :mod:`.registry` runs them by name and
:mod:`.testing` asserts them in pytest, printing the seed that reproduces a failure."""
