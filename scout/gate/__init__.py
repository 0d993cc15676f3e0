"""The two-cycle checkpoint gate and the recovery decision (pure), and the durable manifest."""
