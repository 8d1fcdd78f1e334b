"""Section g: one PNG of every table's ratios (horizontal bars, the baseline at 1, targets dashed)."""
from __future__ import annotations

import textwrap


def plot(tables, memory_rows, path: str, title: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(t.key, t.title, [(r["name"], r["ratio"]) for r in t.stats()], t.target, "time / baseline")
              for t in tables]
    if memory_rows:
        panels.append(("f", "memory added / trainable parameter bytes",
                       [(name, multiple) for name, _, multiple in memory_rows], None, "x parameter bytes"))
    if not panels:  # e.g. --only m: nothing timed, nothing to plot
        return None
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(18, 3.4 * rows), squeeze=False)
    for ax, (key, panel_title, bars, target, xlabel) in zip(axes.flat, panels):
        names = [textwrap.shorten(name, 60, placeholder="…") for name, _ in bars][::-1]
        values = [value for _, value in bars][::-1]
        colors = ["#4c72b0" if value <= 1.0 else "#dd8452" for value in values]
        ax.barh(range(len(values)), values, color=colors)
        ax.set_yticks(range(len(values)), names)
        ax.axvline(1.0, color="black", linewidth=0.8)
        if target:
            ax.axvline(float(target.split()[1]), color="red", linestyle="--", linewidth=1, label=f"target {target}")
            ax.legend(loc="lower right", fontsize=7)
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:.2f}", va="center", fontsize=7)
        ax.set_title(textwrap.fill(f"{key}. {panel_title}", 90), fontsize=8)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
