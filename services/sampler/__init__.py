"""The sampler service: a generation engine, the weight subscriber, admission control and the writer."""
