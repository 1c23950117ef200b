"""Type aliases for cudattn's public signatures (what ``py.typed`` promises type checkers).

Annotations only. cudattn's modules use ``from __future__ import annotations``, so an annotation
is a string that no call evaluates: these names cost nothing on the hot path, and nothing here
is checked at run time (each function checks its own arguments and raises ``TypeError`` /
``ValueError`` as documented). They are real objects, not ``TYPE_CHECKING``-only names, so
``typing.get_type_hints`` resolves every public signature (tests/test_typing.py checks).

Inputs
------
ArrayLike
    An array argument of the NumPy-or-device functions: a NumPy array (host path, NumPy result)
    or a device array: a :class:`cudattn.DeviceArray`, or anything with
    ``__cuda_array_interface__`` or ``__dlpack__`` on a CUDA device (CuPy, PyTorch, JAX, Numba).
    Not NumPy's ``ArrayLike``: nested lists and scalars are refused.
DeviceArrayLike
    A device array only (``DeviceArray`` matches both protocols).
HostArrayLike
    Anything ``numpy.asarray`` takes (``numpy.typing.ArrayLike``): ``to_device`` and the NumPy
    reference.
StreamLike
    The ``stream=`` argument: None (cudattn's stream for the device), an int ``CUstream`` handle,
    a ``cuda.core.Stream`` or anything with ``__cuda_stream__()`` (CuPy, Numba, recent PyTorch),
    or anything with an int ``cuda_stream`` attribute (``torch.cuda.Stream``).
DeviceLike
    The ``device=`` argument: None (the current device, else 0), an int ordinal, or a
    ``cuda.core.Device`` (anything with an int ``device_id``).
DescaleLike
    An FP8 descale (``q_descale`` ...): None (1.0), a float, or a float32 ``(B, Hkv)`` array.
Layout, QuantizePer
    ``"bshd"`` / ``"bhsd"``; ``"tensor"`` / ``"head"``.
DTypeLike
    ``numpy.typing.DTypeLike``, re-exported.

The result alias, ``ArrayResult`` (a NumPy array for NumPy inputs, a :class:`cudattn.DeviceArray`
for device inputs), is defined beside DeviceArray in `array`, which imports these.
"""

from __future__ import annotations

from types import EllipsisType
from typing import Any, Literal, Protocol, SupportsIndex, TypeAlias, Union

from numpy.typing import ArrayLike as HostArrayLike
from numpy.typing import DTypeLike, NDArray

__all__ = [
    "ArrayLike",
    "DTypeLike",
    "DescaleLike",
    "DeviceArrayLike",
    "DeviceLike",
    "HasCudaStreamAttribute",
    "HasDeviceId",
    "HostArrayLike",
    "Index",
    "Layout",
    "QuantizePer",
    "StreamLike",
    "SupportsCudaArrayInterface",
    "SupportsCudaStream",
    "SupportsDLPack",
]


class SupportsCudaArrayInterface(Protocol):
    """Exports the CUDA Array Interface (CuPy, Numba, PyTorch, a DeviceArray not bfloat16)."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...


class SupportsDLPack(Protocol):
    """Exports DLPack (PyTorch, CuPy, JAX, NumPy, a DeviceArray). Producers' ``__dlpack__``
    signatures differ (``stream``, ``max_version``, ``dl_device``, ``copy``), so any is taken."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...

    def __dlpack_device__(self) -> tuple[int, int]: ...


class SupportsCudaStream(Protocol):
    """The ``__cuda_stream__`` protocol: returns ``(0, handle)`` (cuda.core, CuPy, Numba, PyTorch)."""

    def __cuda_stream__(self) -> tuple[int, int]: ...


class HasCudaStreamAttribute(Protocol):
    """An int ``cuda_stream`` attribute: ``torch.cuda.Stream`` / ``ExternalStream``."""

    @property
    def cuda_stream(self) -> int: ...


class HasDeviceId(Protocol):
    """An int ``device_id`` attribute: ``cuda.core.Device``."""

    @property
    def device_id(self) -> int: ...


# Assignments, so evaluated once at import: typing.Union keeps them plain typing objects.
DeviceArrayLike: TypeAlias = Union[SupportsCudaArrayInterface, SupportsDLPack]
ArrayLike: TypeAlias = Union[NDArray[Any], SupportsCudaArrayInterface, SupportsDLPack]
StreamLike: TypeAlias = Union[int, SupportsCudaStream, HasCudaStreamAttribute, None]
DeviceLike: TypeAlias = Union[int, HasDeviceId, None]
DescaleLike: TypeAlias = Union[float, NDArray[Any], SupportsCudaArrayInterface, SupportsDLPack, None]
Layout: TypeAlias = Literal["bshd", "bhsd"]
QuantizePer: TypeAlias = Literal["tensor", "head"]
#: One entry of a basic index (``DeviceArray.__getitem__``).
Index: TypeAlias = Union[SupportsIndex, slice, EllipsisType, None]

