"""The soak as a picture: training step against wall time for each system, faults marked.

A flat stretch is an outage; a drop is work redone after a resume; a restart that
needed the operator is shaded. One panel per system, on the same time axis, so
the same fault schedule can be followed down the page.
"""

from __future__ import annotations

from pathlib import Path

from bench.soak_results import SoakResult

KIND_COLOURS = {
    "crash": "tab:red",
    "hang": "tab:orange",
    "controller_crash": "tab:purple",
    "operator": "tab:gray",
}


def soak_plot(soak: SoakResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(soak.systems.values())
    fig, axes = plt.subplots(
        len(systems), 1, figsize=(11, 3.2 * len(systems)), sharex=True, squeeze=False
    )
    for ax, result in zip(axes[:, 0], systems, strict=True):
        by_generation: dict[int, list[tuple[float, int]]] = {}
        for t, generation, step in result.trace:
            by_generation.setdefault(generation, []).append((t, step))
        for points in by_generation.values():
            times, steps = zip(*points, strict=True)
            ax.plot(times, steps, lw=1.2, marker=".", markersize=2, color="tab:blue")
        seen: set[str] = set()
        for incident in result.incidents:
            colour = KIND_COLOURS.get(incident.kind, "black")
            label = incident.kind if incident.kind not in seen else None
            seen.add(incident.kind)
            style = ":" if incident.kind == "operator" else "--"
            ax.axvline(incident.at_s, color=colour, ls=style, lw=1, label=label)
            if incident.recovery_s is not None:
                ax.axvspan(
                    incident.at_s,
                    incident.at_s + incident.recovery_s,
                    color=colour,
                    alpha=0.12 if incident.handled else 0.3,
                )
        mttr = "-" if result.mttr_s is None else f"{result.mttr_s:.1f} s"
        ax.set_title(
            f"{result.system}: ETTR {result.ettr:.1%}, MTTR {mttr}, "
            f"{result.incident_count} faults, {result.unhandled} unhandled",
            fontsize=10,
        )
        ax.set_ylabel("step")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("wall time since start (s)")
    fig.suptitle(
        f"Chaos soak: {soak.minutes:g} min, a fault about every {soak.fault_every_s:.0f} s "
        f"(seed {soak.seed})",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
