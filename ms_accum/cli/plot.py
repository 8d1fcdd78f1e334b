"""The loss curve `train` draws."""
from __future__ import annotations

from typing import List, Optional, Tuple

def save_loss_plot(losses: List[float], path: str, title: str, ks: Optional[List[int]] = None,
                   noise: Optional[List[Optional[float]]] = None,
                   validation: Optional[List[Tuple[int, float]]] = None) -> str:
    """Writes the per-step loss curve as a PNG; with `ks`, each step's K, a dashed line marks where K changed; with
    `noise`, each step's noise scale estimate is drawn on a second axis; `validation`'s (step, loss) are dots."""
    import matplotlib
    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, linewidth=1, label="window loss")
    if validation:
        ax.plot(*zip(*validation), "o-", color="tab:green", markersize=3, linewidth=1, label="validation loss")
        ax.legend(fontsize=8)
    for step in range(1, len(ks or [])):
        if ks[step] != ks[step - 1]:
            ax.axvline(step + 1, color="gray", linestyle="--", linewidth=0.8)
            ax.annotate(f"K={ks[step]}", (step + 1, 1), xycoords=("data", "axes fraction"), fontsize=8,
                        xytext=(2, -10), textcoords="offset points")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("window loss")
    if noise is not None:
        steps = [step for step, value in enumerate(noise, 1) if value is not None and value > 0]
        right = ax.twinx()
        right.plot(steps, [noise[step - 1] for step in steps], color="tab:orange", linewidth=1)
        right.set_ylabel("gradient noise scale (samples)", color="tab:orange")
        right.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
