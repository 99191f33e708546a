from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    STOP: _ClassVar[FinishReason]
    LENGTH: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
STOP: FinishReason
LENGTH: FinishReason

class Response(_message.Message):
    __slots__ = ("trajectory_id", "tokens", "logprobs", "reward", "finish_reason")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    reward: float
    finish_reason: FinishReason
    def __init__(self, trajectory_id: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., reward: _Optional[float] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ...) -> None: ...

class TrajectoryGroup(_message.Message):
    __slots__ = ("group_id", "example_id", "prompt_tokens", "responses", "policy_version", "sampler_id", "temperature", "started_at", "finished_at")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_ID_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    example_id: str
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    responses: _containers.RepeatedCompositeFieldContainer[Response]
    policy_version: int
    sampler_id: str
    temperature: float
    started_at: float
    finished_at: float
    def __init__(self, group_id: _Optional[str] = ..., example_id: _Optional[str] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., responses: _Optional[_Iterable[_Union[Response, _Mapping]]] = ..., policy_version: _Optional[int] = ..., sampler_id: _Optional[str] = ..., temperature: _Optional[float] = ..., started_at: _Optional[float] = ..., finished_at: _Optional[float] = ...) -> None: ...

class TensorMeta(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("policy_version", "tensors", "chunk_count", "total_bytes", "digest", "plan", "quantized", "format_version")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    QUANTIZED_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    chunk_count: int
    total_bytes: int
    digest: str
    plan: str
    quantized: bool
    format_version: int
    def __init__(self, policy_version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ..., chunk_count: _Optional[int] = ..., total_bytes: _Optional[int] = ..., digest: _Optional[str] = ..., plan: _Optional[str] = ..., quantized: _Optional[bool] = ..., format_version: _Optional[int] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("policy_version", "index", "data", "checksum")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    index: int
    data: bytes
    checksum: str
    def __init__(self, policy_version: _Optional[int] = ..., index: _Optional[int] = ..., data: _Optional[bytes] = ..., checksum: _Optional[str] = ...) -> None: ...

class WeightStreamItem(_message.Message):
    __slots__ = ("manifest", "chunk")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightManifest
    chunk: WeightChunk
    def __init__(self, manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., chunk: _Optional[_Union[WeightChunk, _Mapping]] = ...) -> None: ...

class PublishReply(_message.Message):
    __slots__ = ("policy_version", "bytes_received")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    bytes_received: int
    def __init__(self, policy_version: _Optional[int] = ..., bytes_received: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("after_version", "sampler_id")
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_ID_FIELD_NUMBER: _ClassVar[int]
    after_version: int
    sampler_id: str
    def __init__(self, after_version: _Optional[int] = ..., sampler_id: _Optional[str] = ...) -> None: ...

class VersionAnnouncement(_message.Message):
    __slots__ = ("policy_version", "digest", "total_bytes", "published_at")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    digest: str
    total_bytes: int
    published_at: float
    def __init__(self, policy_version: _Optional[int] = ..., digest: _Optional[str] = ..., total_bytes: _Optional[int] = ..., published_at: _Optional[float] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("policy_version", "sampler_id")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_ID_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    sampler_id: str
    def __init__(self, policy_version: _Optional[int] = ..., sampler_id: _Optional[str] = ...) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetVersionReply(_message.Message):
    __slots__ = ("latest_version", "available_versions")
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    latest_version: int
    available_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, latest_version: _Optional[int] = ..., available_versions: _Optional[_Iterable[int]] = ...) -> None: ...
