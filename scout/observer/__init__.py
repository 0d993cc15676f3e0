"""The out-of-band observer beside each trainer rank (machine: :mod:`scout.core.observer`).

- :mod:`.progress` -- the trainer's progress record in shared memory (no torch);
- :mod:`.instrument` -- publish a torch trainer's progress through public interfaces;
- :mod:`.driver` -- the one observer driver loop, run by the real process and the simulator;
- :mod:`.process` -- the observer process and the trainer's handle on it;
- :mod:`.channel` -- the observers' authenticated UDP channel and rendezvous;
- :mod:`.wire` -- observer messages on the wire, reports as JSON lines;
- :mod:`.mpi` -- starting observers from an MPI program.
"""
