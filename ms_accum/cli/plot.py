"""The loss curve `train` draws."""
from __future__ import annotations

from typing import List, Optional, Tuple


def save_loss_plot(losses: List[float], path: str, title: str, ks: Optional[List[int]] = None,
                   noise: Optional[List[Optional[float]]] = None,
                   validation: Optional[List[Tuple[int, float]]] = None) -> str:
    """Writes the per-step loss curve as a PNG, `validation`'s (step, loss) as dots. When K changes over the run
    (`ks`, each step's K) or the noise scale was estimated (`noise`, each step's estimate), a second panel shows K and
    the estimate against the same steps: where an adaptive K followed the noise scale."""
    import matplotlib
    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt
    second = noise is not None or len(set(ks or [])) > 1
    fig, axes = plt.subplots(2 if second else 1, 1, figsize=(6, 5.5 if second else 3.5), sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": [3, 2] if second else [1]})
    ax = axes[0][0]
    ax.plot(range(1, len(losses) + 1), losses, linewidth=1, label="window loss")
    if validation:
        ax.plot(*zip(*validation), "o-", color="tab:green", markersize=3, linewidth=1, label="validation loss")
        ax.legend(fontsize=8)
    ax.set_ylabel("window loss")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if second:  # each step's K (a step line) and, on a log axis of its own, the noise scale estimate
        ax = axes[1][0]
        if ks:
            ax.step(range(1, len(ks) + 1), ks, where="post", color="tab:blue", linewidth=1)
        ax.set_ylabel("K", color="tab:blue")
        ax.grid(alpha=0.3)
        noisy = [step for step, value in enumerate(noise or [], 1) if value is not None and value > 0]
        if noisy:
            right = ax.twinx()
            right.plot(noisy, [noise[step - 1] for step in noisy], color="tab:orange", linewidth=1)
            right.set_ylabel("noise scale B_simple", color="tab:orange")
            right.set_yscale("log")
    axes[-1][0].set_xlabel("optimizer step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

