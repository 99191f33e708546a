"""The trajectory queue on a Redis stream, and admission control over it (DESIGN.md §5)."""

from nibble.transport.validate import REASONS, reason_code, validate_group

__all__ = ["REASONS", "reason_code", "validate_group"]
