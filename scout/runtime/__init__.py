"""Drivers that connect scout's pure core to the world.

- :mod:`scout.runtime.progress` -- the trainer-side progress record (shared memory, no torch);
- :mod:`scout.runtime.instrument` -- publish progress from torch through public interfaces
  (torch imported lazily);
- :mod:`scout.runtime.observer` -- the out-of-band observer process that drives
  :mod:`scout.core.observer`, and the trainer's handle on it;
- :mod:`scout.runtime.channel` -- the observers' authenticated UDP channel and rendezvous;
- :mod:`scout.runtime.wire` -- observer messages on the wire, reports as JSON lines.
"""
