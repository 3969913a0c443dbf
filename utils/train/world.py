"""Data-parallel training: the ranks a trainer runs as (docs/OPERATIONS.md, "Data-parallel training").

A stage started by a distributed launcher (`accelerate launch` with a multi-process config, which
is torch's elastic launcher underneath) finds WORLD_SIZE > 1 in its environment and joins the
launcher's rendezvous with a gloo process group of its own. That group is deliberately not torch's
default one: an in-process vLLM engine builds its own single-rank default group, and one built on
ours would make every rank's engine start a collective (rank 0's validation engine waited forever
for rank 1). Every rank builds the same global batch from the same seeded stream and takes its
own shard of it (`World.shard`); the gradients are summed over ranks before clipping. Only rank 0
(`main`) writes: manifest, checkpoints, metrics, validation. Without a launcher `World()` is one
process and every method here is the identity. With model.device=cuda each local rank is given
its own GPU before CUDA starts (`pin_gpu`); that path is untested here (no GPU).
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from datetime import timedelta

from utils.core.config import ConfigError

# how long a collective waits for the other ranks: they wait at the next step while rank 0
# validates, which on a real model and val split can take far longer than gloo's 30-minute default
TIMEOUT = timedelta(hours=6)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    group: object = None  # the ranks' gloo ProcessGroup (None in one process)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list, length=len) -> list:
        """This rank's share of a global batch: the items dealt round-robin in decreasing `length`
        (ties in batch order), so every rank gets about the same number of tokens."""
        if self.size == 1:
            return items
        order = sorted(range(len(items)), key=lambda i: (-length(items[i]), i))
        return [items[i] for i in sorted(order[self.rank::self.size])]

    def block(self, items: list) -> tuple[int, list]:
        """(the global index of its first item, this rank's contiguous block of `items`); block sizes
        differ by at most one. An RL step splits its questions so: a question's samples stay on one rank."""
        if self.size == 1:
            return 0, items
        base, extra = divmod(len(items), self.size)
        start = self.rank * base + min(self.rank, extra)
        return start, items[start:start + base + (self.rank < extra)]

    def concat(self, items: list) -> list:
        """Every rank's `items` (picklable), concatenated in rank order, on every rank."""
        if self.size == 1:
            return items
        return [x for part in self.gather(items) for x in part]

    def mean(self, stats: dict) -> dict:
        """`stats` with each number averaged over the ranks that have its key (others: rank 0's value)."""
        if self.size == 1:
            return stats
        parts = self.gather(stats)
        out = {}
        for key in dict.fromkeys(k for p in parts for k in p):
            values = [p[key] for p in parts if key in p]
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            out[key] = sum(values) / len(values) if numeric else values[0]
        return out

    def sum(self, tensor):
        """`tensor`, summed over ranks in place (every rank gets the total). A GPU tensor is summed
        through a host copy: gloo works on CPU tensors, and LoRA gradients are small."""
        if self.size > 1:
            host = tensor.cpu() if tensor.device.type != "cpu" else tensor
            self.group.allreduce([host]).wait()  # the default reduction is a sum
            if host is not tensor:
                tensor.copy_(host)
        return tensor

    def sum_grads(self, params: list) -> None:
        """Sum the gradients of `params` over ranks, as one flat all-reduce (a missing gradient counts as 0)."""
        if self.size == 1:
            return
        import torch

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = self.sum(torch.cat([p.grad.reshape(-1) for p in params]))
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def barrier(self) -> None:
        if self.size > 1:
            self.group.barrier().wait()

    def gather(self, obj) -> list | None:
        """Every rank's `obj` (picklable), in rank order, on every rank; None in a single process."""
        if self.size == 1:
            return None
        import torch

        blob = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(self.size)]
        self.group.allgather([sizes], [torch.tensor([blob.numel()])]).wait()
        width = int(max(sizes).item())
        parts = [torch.zeros(width, dtype=torch.uint8) for _ in range(self.size)]
        padded = torch.cat([blob, torch.zeros(width - blob.numel(), dtype=torch.uint8)])
        self.group.allgather([parts], [padded]).wait()
        return [pickle.loads(p[:int(n.item())].numpy().tobytes()) for p, n in zip(parts, sizes)]


SOLO = World()  # one process: the default of every trainer


def pin_gpu(env: dict) -> str | None:
    """Give this local rank its own GPU: the LOCAL_RANK-th of CUDA_VISIBLE_DEVICES (or GPU LOCAL_RANK
    when unset) becomes the only one it sees, so the trainer's `cuda` and an in-process vLLM engine
    both land on it. Returns the new CUDA_VISIBLE_DEVICES, or None in a single local process. Only
    effective before CUDA starts in this process."""
    size = int(env.get("LOCAL_WORLD_SIZE", "1"))
    if size <= 1 or "LOCAL_RANK" not in env:
        return None
    rank = int(env["LOCAL_RANK"])
    listed = env.get("CUDA_VISIBLE_DEVICES")  # set but empty: no GPU at all
    visible = ([d.strip() for d in listed.split(",") if d.strip()] if listed is not None
               else [str(i) for i in range(size)])
    if len(visible) < size:
        raise ConfigError(f"model.device=cuda with {size} ranks on this machine needs a GPU per rank; "
                          f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} names {len(visible)}")
    env["CUDA_VISIBLE_DEVICES"] = visible[rank]
    return visible[rank]


def _check_cuda(env: dict) -> None:
    """Pin this rank's GPU, then fail clearly if torch cannot use one (before any work is done)."""
    import torch

    if torch.cuda.is_initialized() and int(env.get("LOCAL_WORLD_SIZE", "1")) > 1:  # one process needs no pin
        raise ConfigError("model.device=cuda: CUDA started before the ranks were given their GPUs; "
                          "join_world must run before anything touches CUDA")
    pin_gpu(env)
    if not torch.cuda.is_available():
        raise ConfigError(f"model.device=cuda but torch {torch.__version__} sees no GPU "
                          f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                          "use model.device=cpu or a CUDA build of torch (requirements-cuda.txt)")


def join_world(device: str = "cpu") -> World:
    """The world this process was launched into: one process, or its rank among WORLD_SIZE ones,
    joined through the launcher's rendezvous (env://: MASTER_ADDR, MASTER_PORT, RANK). With
    `device` "cuda" each local rank is first given its own GPU (`pin_gpu`). The group is gloo
    either way: collectives on GPU tensors go through host copies (`World.sum`)."""
    if device == "cuda":
        _check_cuda(os.environ)
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return World()
    import torch.distributed as dist

    store, rank, size = next(dist.rendezvous("env://"))
    return World(rank, size, dist.ProcessGroupGloo(store, rank, size, TIMEOUT))
