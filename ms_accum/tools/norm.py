"""BatchNorm -> GroupNorm: make a network's output independent of how a batch is split into micro-batches.

BatchNorm in training mode normalizes each micro-batch with that micro-batch's own mean and variance, so K accumulated
micro-batches of B are NOT one batch of K*B (`verify_equivalence` reports it), and its running statistics are updated K
times per optimizer step. GroupNorm normalizes each sample on its own, so accumulation is exact again (MindSpore's
gradient-accumulation page notes that some implementations do this). The swap changes the model: train it from scratch.
"""
from __future__ import annotations

from typing import List

from mindspore import nn

from .._mindspore import batchnorm_types
from .._validation import check_isinstance, check_positive_int, door


@door("replace_batchnorm")
def replace_batchnorm(network: nn.Cell, num_groups: int = 32) -> List[str]:
    r"""
    Replaces every BatchNorm in `network` that normalizes by the batch's statistics, in place, by an
    `nn.GroupNorm` over the same channels, which normalizes each sample on its own.

    Every kind `verify_equivalence` names is replaced: `nn.BatchNorm2d`, `nn.SyncBatchNorm` and other subclasses of
    MindSpore's BatchNorm get the largest group count not above `num_groups` that divides the channels;
    `nn.BatchNorm1d` (inputs :math:`(N, C)` or :math:`(N, C, L)`) gets one group, a normalization over all of a
    sample's features as LayerNorm's, since groups of one channel of an :math:`(N, C)` input would normalize every
    value to 0; `nn.BatchNorm3d` is a cell around a BatchNorm2d (``<path>.bn2d``), which is replaced, so its
    parameter names stay. Each replacement keeps the BatchNorm's `eps`, `affine` and dtype and takes its parameter
    names (``<path>.gamma``, ``<path>.beta``), so optimizers must be built after the swap. A BatchNorm with
    ``use_batch_statistics=False`` (frozen: it normalizes by its moving statistics, per sample) is left as it is.

    Args:
        network (nn.Cell): The network to change.
        num_groups (int): The most groups per GroupNorm (BatchNorm1d's take one). Default: ``32``.

    Returns:
        list[str], the paths of the replaced cells.

    Raises:
        TypeError: If `network` is not a Cell or `num_groups` not an int.
        ValueError: If `num_groups` is not positive.

    Supported Platforms:
        ``Ascend`` ``GPU`` ``CPU``

    Examples:
        >>> from ms_accum import replace_batchnorm
        >>> replaced = replace_batchnorm(net)        # before creating the optimizer
    """
    check_isinstance(network, "network", nn.Cell)
    check_positive_int(num_groups, "num_groups")
    replaced = []
    for path, cell in list(network.cells_and_names()):
        for name, child in list(cell.name_cells().items()):
            full = f"{path}.{name}" if path else name
            if not isinstance(child, batchnorm_types()) or child.use_batch_statistics is False:
                continue
            channels = child.num_features
            # The largest divisor of `channels` not above `num_groups` (GroupNorm needs channels % groups == 0).
            groups = 1 if isinstance(child, nn.BatchNorm1d) else max(
                g for g in range(1, min(num_groups, channels) + 1) if channels % g == 0)
            # BatchNorm keeps gamma and beta either way; affine=False freezes them (requires_grad False).
            norm = nn.GroupNorm(groups, channels, eps=float(child.eps), affine=child.gamma.requires_grad,
                                dtype=child.gamma.dtype)
            if isinstance(cell, (nn.SequentialCell, nn.CellList)):
                cell[int(name)] = norm  # also updates the list their construct iterates
            else:
                cell.insert_child_to_cell(name, norm)
            norm.update_parameters_name(full + ".")
            replaced.append(full)
    return replaced
