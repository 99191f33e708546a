"""Transports between the services (docs/design.md §1, §5), one subpackage per medium, each an interface plus
its implementation:

- :mod:`nibble.transport.stream`: the trajectory stream (sampler → trainer) — ``TrajectoryWriter`` /
  ``TrajectoryReader`` on Redis, with admission control, validation, dead letters and sampler presence.
- :mod:`nibble.transport.weights`: weight transfer (trainer → weight-sync → samplers) — ``WeightPublisher``
  / ``WeightSubscriber`` over gRPC, with the chunked payload format, its assembler, tokens and TLS.
"""
