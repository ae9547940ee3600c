"""The one name people read for a device (pages, CLI, messages, metrics' labels).

Kept apart from :mod:`app.services.devices` so that the conflict messages of
:mod:`app.services.conflicts`, which that module builds on, name devices the same way.
"""

from __future__ import annotations

from app.models import Device


def device_label(device: Device, parent: Device | None) -> str:
    """The one name people read for a device: ``"GPU 0"`` for a whole GPU, ``"GPU 0 · MIG 4"``
    for the MIG slice with GPU-instance id 4 on GPU 0 (``parent``: its whole GPU, ``None``
    when unknown). Machines use the NVML UUID instead (``MIG-…`` for a slice), which
    survives re-indexing; the GPU-instance id is what ``nvidia-smi mig -lgi`` lists."""
    return slice_label(device.index, device.parent_id, device.gpu_instance_id, device.uuid,
                       parent.index if parent is not None else None)


def slice_label(index: int | None, parent_id: int | None, gpu_instance_id: int | None, uuid: str,
                parent_index: int | None) -> str:
    """:func:`device_label` from a device's columns (plain rows)."""
    if parent_id is None:
        return f"GPU {index}" if index is not None else f"GPU {uuid}"
    idx = parent_index if parent_index is not None else "?"
    gi = gpu_instance_id if gpu_instance_id is not None else "?"
    return f"GPU {idx} · MIG {gi}"


__all__ = ["device_label", "slice_label"]
