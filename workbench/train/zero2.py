"""DeepSpeed ZeRO-2 under `accelerate launch` (training/accelerate/zero2.yaml): the trainer's AdamW, partitioned.

`Zero2Optimizer` wraps the trainer's own AdamW (its named groups and their rates) in a DeepSpeed engine with
`zero_optimization.stage = 2`: each rank keeps 1/N of the fp32 master copy, the gradients and the AdamW state of
the *trained* tensors; the trained tensors themselves and the frozen base stay whole on every rank. It stands in
for the optimizer in the trainer (`param_groups` with the real parameters and names, `zero_grad`, `state_dict`,
`load_state_dict`), and adds what the trainer's step needs:

- `backward(loss)`: each rank's loss is its shard's divided by the global normaliser (the trainer's SUM over ranks),
  while DeepSpeed AVERAGES gradients over ranks; the loss is scaled by N before DeepSpeed's backward, so the
  reduced gradient is the sum, what one process computes on the whole batch. Returns the loss summed over ranks.
- `grad_squares()`: the squared sum of each trained tensor's FULL gradient (`deepspeed.utils.safe_get_full_grad`,
  one all-reduce per tensor, each freed after use), for the per-group grad_rms, grad_norm and the re-entry
  liveness check, read after backward and before the step as one process reads them.
- `step_with_movement()`: DeepSpeed's step (clipping at the recipe's clip inside it, on the same global norm), and
  the realized RMS movement per group, measured on each rank's fp32 partition and summed over ranks.
- A group none of whose tensors got a gradient on any rank this step (the re-entry on a one-loop step) is left
  exactly as one process leaves it (AdamW skips a tensor whose grad is None): its rate is 0 for the step and its
  AdamW state (moments and step count) is put back. A group whose tensors are only partly touched is refused:
  ZeRO-2 steps a group's flat partition as one, so it cannot skip one tensor the way one process does.
- Checkpoints hold the full AdamW state in torch's own per-parameter format (gathered with
  `safe_get_full_optimizer_state`), so a ZeRO-2 checkpoint resumes in one process and the reverse.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
from unittest import mock

import torch

from workbench.errors import WorkbenchError

_MOMENTS = ("exp_avg", "exp_avg_sq")


def _quiet_deepspeed() -> None:
    """DeepSpeed logs to stdout at INFO; `workbench train --json` prints one JSON object there."""
    import logging  # noqa: PLC0415 - only a zero2 run gets here

    from deepspeed.utils import logger  # noqa: PLC0415 - deepspeed is optional: only a zero2 run imports it

    logger.setLevel(logging.WARNING)


class Zero2Optimizer:
    """The trainer's AdamW inside a DeepSpeed ZeRO-2 engine (see the module docstring).

    Args:
        looped: the retrofit (its trained tensors are the optimizer's).
        optimizer: the trainer's per-tensor AdamW (`workbench.train.optim.make_optimizer`), every group named.
        clip: the gradient clipping norm (0: none), applied by DeepSpeed on the full gradient's norm.
        world_size: the number of ranks (the loss scale).
    """

    def __init__(self, looped, optimizer: torch.optim.Optimizer, clip: float, world_size: int):
        # DeepSpeed print()s to stdout (its CPU accelerator's shared-memory op: "... built successfully"), where
        # `workbench train --json` writes its one JSON object: everything it prints while starting goes to stderr.
        with contextlib.redirect_stdout(sys.stderr):
            self._start(looped, optimizer, clip, world_size)

    def _start(self, looped, optimizer, clip: float, world_size: int) -> None:
        import deepspeed  # noqa: PLC0415 - optional: only a zero2 run imports it

        _quiet_deepspeed()
        if not isinstance(optimizer, torch.optim.AdamW):
            raise WorkbenchError(f"zero2: optim.name gives {type(optimizer).__name__}; ZeRO-2 here partitions "
                                 "AdamW's state only (optim.name = 'adamw')")
        self.client, self.world = optimizer, world_size
        # DeepSpeed replaces each group's "params" by its flat fp32 partition: keep the real tensors and names.
        self.params = [list(g["params"]) for g in optimizer.param_groups]
        self.touched: set[int] = set()
        self._gathered: dict | None = None   # the full AdamW state, between gather_state and state_dict
        self._hooks = [p.register_post_accumulate_grad_hook(self._touch) for ps in self.params for p in ps]
        numel = sum(p.numel() for ps in self.params for p in ps)
        # DeepSpeed's default 5e8-element reduce bucket is allocated whole: as large as every trained gradient for
        # any model below 5e8 trained weights. 1/N of them (at least 2**20) keeps the gradient memory at about 2/N.
        bucket = int(min(5e8, max(-(-numel // world_size), 1 << 20)))
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "gradient_clipping": float(clip), "steps_per_print": 2 ** 62, "wall_clock_breakdown": False,
                  "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": False,
                                        "reduce_scatter": True, "reduce_bucket_size": bucket,
                                        "allgather_bucket_size": bucket}}
        # The engine's module holds the trained tensors alone (named as in the retrofit): the trainer calls the
        # retrofit itself, and ZeRO-2 partitions the optimizer's tensors. The engine's start-up broadcast from rank 0
        # is skipped: every rank built the same tensors from the recipe's seed, and it cannot send 0-dim tensors.
        names = {id(p): n for n, p in looped.named_parameters()}
        holder = torch.nn.Module()
        for ps in self.params:
            for p in ps:
                holder.register_parameter(names[id(p)].replace(".", "__"), p)
        # DeepSpeed's CPU backend also JIT-compiles a shared-memory all-reduce (g++, about 45 s on a machine's first
        # run) that only its inference all-reduce calls; ZeRO-2 reduces and gathers through torch.distributed.
        with mock.patch.object(deepspeed.runtime.engine.DeepSpeedEngine, "_broadcast_model", lambda engine: None), \
                mock.patch.object(importlib.import_module("deepspeed.comm.torch"), "build_shm_op", lambda: None):
            self.engine, self.zero, _, _ = deepspeed.initialize(model=holder, optimizer=optimizer, config=config)

    def close(self) -> None:
        """Removes this engine's gradient hooks (DeepSpeed's and ours): a new optimizer replaces it (the halting
        stage's, or a resume trying an older checkpoint), and two engines must not both reduce one tensor's gradient."""
        for hook in self._hooks:
            hook.remove()
        self.engine.destroy()

    def _touch(self, param) -> None:
        self.touched.add(id(param))

    # ------------------------------------------------------------------ what the trainer reads
    @property
    def param_groups(self) -> list[dict]:
        """The client groups (live rates) with their real parameters, as `optimizer.param_groups` reads."""
        return [{**g, "params": ps} for g, ps in zip(self.client.param_groups, self.params)]

    @property
    def defaults(self) -> dict:
        return self.client.defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.zero.zero_grad(set_to_none=set_to_none)
        self.touched.clear()

    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        """DeepSpeed's backward on `loss` × N (its average over ranks is then the trainer's sum); returns the loss
        summed over ranks (detached)."""
        self.engine.backward(loss * self.world)
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        return total

    def grad_squares(self) -> dict[int, float]:
        """{id(param): sum of squares of its full gradient} (float64 sums; a collective: every rank calls it)."""
        from deepspeed.utils import safe_get_full_grad  # noqa: PLC0415 - optional

        out = {}
        for ps in self.params:
            for p in ps:
                g = safe_get_full_grad(p)
                out[id(p)] = 0.0 if g is None else float(g.detach().double().pow(2).sum())
        return out

    def group_rms(self, squares: dict[int, float]) -> dict[str, float]:
        """RMS of the full gradient per group (`workbench.train.optim.group_rms` on one process)."""
        return {g["name"]: math.sqrt(sum(squares[id(p)] for p in ps) / max(sum(p.numel() for p in ps), 1))
                for g, ps in zip(self.client.param_groups, self.params)}

    def _untouched_groups(self, names) -> list[int]:
        """Indices of the groups no rank gave a gradient this step; refuses a partly touched group."""
        flags = torch.tensor([float(id(p) in self.touched) for ps in self.params for p in ps], dtype=torch.float64,
                             device=self.params[0][0].device)
        torch.distributed.all_reduce(flags)
        hit, out, i = flags.tolist(), [], 0
        for gi, ps in enumerate(self.params):
            got = hit[i: i + len(ps)]
            i += len(ps)
            if not any(got):
                out.append(gi)
            elif not all(got):
                miss = names[gi][got.index(0.0)]
                raise WorkbenchError(f"zero2: trained tensor '{miss}' got no gradient while the rest of its group "
                                     f"'{self.client.param_groups[gi]['name']}' did; ZeRO-2 steps a group as one "
                                     "(use --preset ddp for this recipe)")
        return out

    def step_with_movement(self, names: list[list[str]]) -> dict[str, float]:
        """DeepSpeed's step (clipped inside); returns the RMS movement per group (`optim.step_with_movement`).

        `names` are the parameter names of each group (for the error on a partly touched group)."""
        groups = self.client.param_groups   # each holds this rank's flat fp32 partition now
        skip = self._untouched_groups(names)
        held = {}
        for gi in skip:   # one process: AdamW skips a tensor whose grad is None (no move, no state change)
            g = groups[gi]
            held[gi] = (g["lr"], [{k: v.clone() for k, v in self.client.state[p].items()} if p in self.client.state
                                  else None for p in g["params"]])
            g["lr"] = 0.0
        before = [[p.detach().clone() for p in g["params"]] for g in groups]
        self.engine.step()
        self._link_state()
        for gi, (lr, states) in held.items():
            groups[gi]["lr"] = lr
            for p, saved in zip(groups[gi]["params"], states):
                state = self.client.state[p]
                for k, v in state.items():   # a fresh state (never stepped before) goes back to step 0, zero moments
                    v.copy_(saved[k] if saved is not None else torch.zeros_like(v))
        sq = torch.tensor([sum(float((p.detach() - b).double().pow(2).sum()) for p, b in zip(g["params"], bs))
                           for g, bs in zip(groups, before)], dtype=torch.float64, device=self.params[0][0].device)
        torch.distributed.all_reduce(sq)
        return {g["name"]: math.sqrt(s / max(sum(p.numel() for p in ps), 1))
                for g, ps, s in zip(groups, self.params, sq.tolist())}

    # ------------------------------------------------------------------ checkpoints
    def gather_state(self, keep: bool) -> None:
        """Gathers the full AdamW state in torch's per-parameter format (a collective: every rank calls it, one
        tensor at a time); `keep` (the main process, which saves it) holds it for the next `state_dict` call."""
        from deepspeed.utils import safe_get_full_optimizer_state  # noqa: PLC0415 - optional

        state, index = {}, 0
        for g, ps in zip(self.client.param_groups, self.params):
            step = self.client.state.get(g["params"][0], {}).get("step")
            for p in ps:
                if step is not None and float(step) > 0:   # never stepped: no state, as in one process
                    full = {k: safe_get_full_optimizer_state(p, k).detach() for k in _MOMENTS}
                    if keep:
                        state[index] = {"step": step.detach().clone(), **full}
                index += 1
        self._gathered = state if keep else None

    def state_dict(self) -> dict:
        """What `gather_state(keep=True)` gathered (then released), with the groups' hyperparameters."""
        if self._gathered is None:
            raise RuntimeError("Zero2Optimizer.state_dict: call gather_state(keep=True) on this rank first")
        index, groups = 0, []
        for g, ps in zip(self.client.param_groups, self.params):
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(index,
                                                                                               index + len(ps)))})
            index += len(ps)
        state, self._gathered = self._gathered, None   # the full moments are not held between checkpoints
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd: dict) -> None:
        """Loads a torch AdamW state dict (one process's or `state_dict`'s) into the partitions, after the trained
        tensors were loaded into the parameters (their fp32 master copies are set from them here)."""
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state  # noqa: PLC0415

        if len(sd["param_groups"]) != len(self.params):
            raise WorkbenchError(f"zero2: the checkpoint's optimizer has {len(sd['param_groups'])} groups, this run "
                                 f"{len(self.params)}")
        for ps in self.params:
            for p in ps:
                safe_set_full_fp32_param(p, p.detach().float())
        groups = self.client.param_groups
        for g, saved in zip(groups, sd["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self._prime_state()
        index = 0
        for g, ps in zip(groups, self.params):
            flat = self.client.state[g["params"][0]]
            steps = {float(sd["state"][index + j]["step"]) for j in range(len(ps)) if index + j in sd["state"]}
            if len(steps) > 1:
                raise WorkbenchError(f"zero2: the checkpoint's group '{g['name']}' holds tensors stepped different "
                                     "numbers of times; ZeRO-2 keeps one count per group")
            flat["step"].fill_(steps.pop() if steps else 0.0)
            for j, p in enumerate(ps):
                entry = sd["state"].get(index + j)
                for k in _MOMENTS:
                    safe_set_full_optimizer_state(p, entry[k].to(p.device) if entry is not None
                                                  else torch.zeros_like(p, dtype=torch.float32), k)
            index += len(ps)

    def _prime_state(self) -> None:
        """Creates AdamW's (lazy) state on every partition with a step at rate 0 and zero gradients, which moves
        nothing, and links DeepSpeed's per-tensor views of it; the state is then overwritten by the caller."""
        groups = self.client.param_groups
        if all(g["params"][0] in self.client.state for g in groups):
            return
        rates = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = 0.0
            for p in g["params"]:
                p.grad = torch.zeros_like(p)
        self.client.step()
        for g, lr in zip(groups, rates):
            g["lr"] = lr
            for p in g["params"]:
                p.grad = None
        self._link_state()

    def _link_state(self) -> None:
        """Points each tensor's DeepSpeed fragment at its slice of its group's AdamW state (for
        `safe_get/set_full_optimizer_state`). DeepSpeed 0.19.8 links once, right after the FIRST group's first
        step, when the other groups have no state yet; their links stay empty. Linking again after each step
        makes every group's link current (AdamW updates its state in place, so the views stay valid)."""
        from deepspeed.utils.mixed_precision_linkage import lazy_init_hp_params_optimizer_state  # noqa: PLC0415

        for g, ps in zip(self.client.param_groups, self.params):
            flat = g["params"][0]
            if flat in self.client.state:
                lazy_init_hp_params_optimizer_state(ps, flat, self.client.state)
