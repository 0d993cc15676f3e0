"""The demo's jobs (being replaced by the example training script in examples/)."""
