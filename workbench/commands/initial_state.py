"""`--init-seed N` / `--init-state FILE`: the initial state s_0 of a family whose loop starts from one (Raven).

One definition for every command that reads such a model (`generate`, `lens`): s_0 is drawn per position from a
generator seeded by N (the model's default seed, 0, when neither is given), or read from a safetensors file that
holds one tensor, a prompt's s_0 [tokens, d] or every prompt's [prompts, tokens, d], so two reads of the same
prompt agree. Every check on the file runs before the model loads; a model without an initial state refuses both.
"""

from __future__ import annotations

from pathlib import Path

import typer

from workbench.errors import WorkbenchError

INIT_SEED = typer.Option(None, "--init-seed", min=0, help="For a family whose loop starts from a random state "
                         "(Raven/Huginn): the seed s_0 is drawn from, per position (default: the model's, 0).")
INIT_STATE = typer.Option(None, "--init-state", help="For a family whose loop starts from a random state "
                          "(Raven/Huginn): a safetensors file of one floating tensor, the prompt's s_0 [tokens, d] "
                          "or every prompt's [prompts, tokens, d]; new tokens draw theirs from --init-seed.")


def read_init_state(path: Path | None):
    """The tensor of an --init-state file ([tokens, d] or [prompts, tokens, d], floating, finite), or None.

    Raises:
        WorkbenchError: not a file, not safetensors, not exactly one tensor, not 2-D or 3-D, not floating, not finite.
    """
    if path is None:
        return None
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    where = f"--init-state '{path}'"
    if not Path(path).is_file():
        raise WorkbenchError(f"{where} is not a file (give a safetensors file holding s_0)")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise WorkbenchError(f"{where} is not a readable safetensors file "
                             f"({str(err).splitlines()[0][:120] if str(err) else type(err).__name__})") from None
    if len(tensors) != 1:
        raise WorkbenchError(f"{where} holds {len(tensors)} tensors ({', '.join(sorted(tensors)) or 'none'}); "
                             "it must hold one, s_0 [tokens, d] or [prompts, tokens, d]")
    (name, state), = tensors.items()
    if not state.is_floating_point():
        raise WorkbenchError(f"{where}: tensor {name} is {str(state.dtype).removeprefix('torch.')}; s_0 is a "
                             "floating tensor (float32, bfloat16, float16)")
    if state.dim() not in (2, 3):
        raise WorkbenchError(f"{where}: tensor {name} has shape {tuple(state.shape)}; s_0 is [tokens, d] or "
                             "[prompts, tokens, d]")
    if not bool(torch.isfinite(state).all()):
        raise WorkbenchError(f"{where}: tensor {name} holds values that are not finite")
    return state


def prompt_states(state, n_prompts: int):
    """Each prompt's s_0 from the file's tensor: a [tokens, d] one is the one prompt's, [prompts, tokens, d] as is."""
    if state is None or state.dim() == 3:
        return state
    if n_prompts != 1:
        raise WorkbenchError(f"--init-state holds one s_0 {tuple(state.shape)} for {n_prompts} prompts; give one "
                             "[prompts, tokens, d] tensor")
    return [state]
