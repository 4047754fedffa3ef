"""Peak training memory: the CUDA allocator's peak, or a deterministic accounting on CPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

MB = 1024.0 * 1024.0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class MemoryMeter:
    """On CPU: bytes of parameters + gradients + optimizer state + the peak, over steps, of the
    tensors saved for backward (each storage counted once, parameters excluded). Shapes alone
    decide it, so equal configs give equal numbers on any machine.
    """

    def __init__(self, device: torch.device, modules: Iterable[torch.nn.Module]) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.modules = list(modules)
        self._saved_peak = 0
        self._step_ids: set[int] = set()
        self._step_bytes = 0
        self._param_ptrs: set[int] = set()
        if self.cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)

    @property
    def source(self) -> str:
        return "cuda_max_allocated" if self.cuda else "cpu_accounting"

    @contextlib.contextmanager
    def step(self, extra_params: Iterable[torch.Tensor] = ()) -> Iterator[None]:
        """Wrap one forward+backward; records the bytes saved for backward."""
        if self.cuda:
            yield
            return
        if not self._param_ptrs:
            params = [p for m in self.modules for p in m.parameters()] + list(extra_params)
            self._param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self._step_ids.clear()
        self._step_bytes = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in self._param_ptrs and ptr not in self._step_ids:
                self._step_ids.add(ptr)
                self._step_bytes += storage.nbytes()
            # detached: a saved graph output kept with its grad_fn would form a cycle through
            # autograd's C++ side that no gc can break, so the forward of a branch the loss does
            # not use (SDXL's unused last encoder layer) would keep its graph, this meter and the
            # model alive; autograd re-attaches the grad_fn when it unpacks (lossless)
            return t.detach()

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self._saved_peak = max(self._saved_peak, self._step_bytes)

    def peak_mb(self, trainable: Iterable[torch.Tensor], optimizer: torch.optim.Optimizer) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) / MB
        seen: set[int] = set()
        total = 0
        for m in self.modules:
            for t in list(m.parameters()) + list(m.buffers()):
                if t.untyped_storage().data_ptr() not in seen:
                    seen.add(t.untyped_storage().data_ptr())
                    total += _nbytes(t)
        trainable = list(trainable)
        for p in trainable:
            if p.untyped_storage().data_ptr() not in seen:
                total += _nbytes(p)
        total += sum(_nbytes(p) for p in trainable)  # one gradient per trainable tensor
        for state in optimizer.state.values():
            total += sum(_nbytes(v) for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
        return (total + self._saved_peak) / MB
