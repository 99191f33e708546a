"""The reason codes that label ``nibble_dead_lettered_total`` and ``nibble_rejected_total``: one
vocabulary, here so that the metric definitions (:mod:`nibble.monitoring.metrics`) pre-create every
series without importing the transports that raise these codes
(:mod:`nibble.transport.stream.validate`, :class:`nibble.transport.weights.assembler.WeightAssembler`).
"""

# Why a trajectory group is dead-lettered: the stream's validation (nibble.transport.stream.validate).
UNDECODABLE = "undecodable"  # the payload is not a TrajectoryGroup (or the entry has no payload field)
MISSING_PAYLOAD = "missing_payload"  # a pending entry whose data was deleted from the stream
TOO_FEW_RESPONSES = "too_few_responses"
MISSING_ID = "missing_id"
DUPLICATE_TRAJECTORY_ID = "duplicate_trajectory_id"
EMPTY_PROMPT = "empty_prompt"
EMPTY_RESPONSE = "empty_response"
LENGTH_MISMATCH = "length_mismatch"
NEGATIVE_TOKEN = "negative_token"
NON_FINITE_REWARD = "non_finite_reward"
BAD_TEMPERATURE = "bad_temperature"
# The trainer's own checks of a valid group against its model and config (``nibble.trainer.intake``).
TOKEN_OUT_OF_VOCAB = "token_out_of_vocab"
TOO_LONG = "too_long"
TEMPERATURE_MISMATCH = "temperature_mismatch"
DEAD_LETTER_REASONS = (
    UNDECODABLE,
    MISSING_PAYLOAD,
    TOO_FEW_RESPONSES,
    MISSING_ID,
    DUPLICATE_TRAJECTORY_ID,
    EMPTY_PROMPT,
    EMPTY_RESPONSE,
    LENGTH_MISMATCH,
    NEGATIVE_TOKEN,
    NON_FINITE_REWARD,
    BAD_TEMPERATURE,
    TOKEN_OUT_OF_VOCAB,
    TOO_LONG,
    TEMPERATURE_MISMATCH,
)
"""Every code a trajectory-group entry is dead-lettered with (``nibble_dead_lettered_total{reason}``)."""

WEIGHT_REASONS = (
    "no_manifest",
    "bad_manifest",
    "unsupported_dtype",
    "bad_extent",
    "oversize",
    "wrong_version",
    "out_of_order",
    "duplicate_chunk",
    "unknown_chunk",
    "bad_checksum",
    "missing_chunks",
    "digest_mismatch",
)
"""Every ``WeightRejected.reason`` the weight assembler raises (metric label values)."""
