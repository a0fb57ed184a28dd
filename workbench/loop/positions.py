"""Where each row's tokens sit: the last real token and position ids, for either padding side.

Loop-1 identity rests on these: the looped forward, the reference base forward, the reader and
every probe must count positions the same way, so they all call these two functions.
"""

from __future__ import annotations

import torch


def last_real_token(attention_mask: torch.Tensor) -> torch.Tensor:
    """Returns [batch] the index of each row's last real token (mask 1), left or right padded."""
    return attention_mask.shape[-1] - 1 - attention_mask.long().flip(-1).argmax(-1)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Returns [batch, seq] positions counted over real tokens only, so padding cannot shift them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
