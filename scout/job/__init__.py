"""scout on a training job: ``scout.attach`` and what it runs on every rank."""
