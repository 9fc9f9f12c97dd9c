"""The picture of examples/dos_compare.py (compare.png): the update seconds of every run, baseline
and peer beside the lower bound, and under them the timeline of one phase when there is one."""

from timeline_summary import pcie_windows  # the PCIe rates per window, as the summary counts them


def draw(plt, png, rows, baselines, peers, tl):
    """Draws compare.png into ``png`` with ``plt`` (matplotlib.pyplot, Agg backend): the update
    seconds (median) of every dos-train run (``rows``: dicts of compare.json with ``label``,
    ``update_seconds``, optional ``update_seconds_min`` / ``_max``, ``params``, ``subgroups``,
    ``lower_bound_seconds``; blue, with their min..max), baseline (``baselines``, likewise; green) and
    peer (``peers``: label -> seconds; grey), the first lower bound found (red, dashed), and under
    them, when ``tl`` (dos-train's --timeline JSON: ``tasks``, ``bus``, ``policy``, ``iteration``)
    is given, its tasks on the CPU and GPU lanes and the PCIe rates (GB/s averaged over 20 ms
    windows of the cumulative bus samples)."""
    bars = [(r["label"], r["update_seconds"], "C0", r) for r in rows] + \
        [(b["label"], b["update_seconds"], "C2", b) for b in baselines] + \
        [(f"peer {k}", v, "C7", {}) for k, v in peers.items()]
    fig, axes = plt.subplots(2 if tl else 1, 1, figsize=(max(8, 0.75 * len(bars) + 3), 8 if tl else 4.5),
                             squeeze=False)
    ax = axes[0][0]
    err = [[b[1] - b[3].get("update_seconds_min", b[1]) for b in bars],
           [b[3].get("update_seconds_max", b[1]) - b[1] for b in bars]]
    ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars], yerr=err, capsize=3)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([b[0] for b in bars], rotation=35, ha="right", fontsize=8)
    ax.set(ylabel="update phase, s (median)", title=f"{rows[0]['params']:,} parameters, {rows[0]['subgroups']} subgroup{'' if rows[0]['subgroups'] == 1 else 's'}"
           if rows else "")
    lbr = next((r for r in rows if r.get("lower_bound_seconds")), None)
    if lbr:
        lb = lbr["lower_bound_seconds"]
        ax.axhline(lb, color="C3", ls="--", label=f"lower bound ({lbr['label']}) {lb:.3f} s")
        ax.legend(fontsize=8)
    if tl:
        ax = axes[1][0]
        # h2d, d2h: the runtime's own parameter uploads and gradient downloads, on the PCIe row;
        # writeback: a streamed subgroup's state, from its Adam's end to home (these may overlap)
        lanes = {"cpu": 3, "gpu": 2, "h2d": 1.1, "d2h": 0.9, "writeback": 2.5}
        colors = {"adam": "C0", "gather": "C2", "scatter": "C1", "state": "C3"}
        for t in tl["tasks"]:
            ax.barh(lanes[t["lane"]], t["end"] - t["start"], left=t["start"], height=0.7 if t["lane"] in ("cpu", "gpu") else 0.2,
                    color=colors.get(t["what"], "C4"), edgecolor="none")
        # PCIe rates from the cumulative bus samples (bytes are counted a whole transfer at once,
        # StarPU's when issued and the runtime's own copies when ended,
        # so rates are averaged over windows of 20 ms, or a twentieth of a shorter phase)
        bus = tl["bus"]
        last = max([t["end"] for t in tl["tasks"]] + [bus[-1][0] if bus else 0.0])
        bus = sorted(bus)
        end = bus[-1][0] if bus else 0.0
        w = min(0.02, end / 20)
        windows = pcie_windows(bus, end, w) if end > 0 else []
        if windows:
            ts = [t0 + w / 2 for t0, _, _ in windows]
            up = [h for _, h, _ in windows]
            down = [d for _, _, d in windows]
            peak = max(max(up), max(down))
            scale = peak if peak > 0 else 1.0
            ax.fill_between(ts, 1 - 0.4, [1 - 0.4 + 0.8 * u / scale for u in up], step="mid", color="C4", alpha=0.7)
            ax.fill_between(ts, 0 - 0.4, [0 - 0.4 + 0.8 * d / scale for d in down], step="mid", color="C5", alpha=0.7)
            ax.text(last, 1, f" H2D (peak {peak:.1f} GB/s)" if peak > 0 else " no PCIe traffic", va="center",
                    fontsize=8)
            ax.text(last, 0, " D2H", va="center", fontsize=8)
        if last > 0:
            ax.set_xlim(0, last)
        ax.set_yticks([0, 1, 2, 2.5, 3])
        ax.set_yticklabels(["D2H", "H2D", "GPU worker", "state home", "CPU worker"])
        ax.set(xlabel="seconds since the update phase began",
               title=f"policy {tl['policy']}, iteration {tl['iteration']}\nAdam (blue), gradient staging (green),\n"
                     f"parameter write-back (orange), state write-back from its Adam's end (red)")
        ax.title.set_fontsize(9)  # three lines that fit the figure's width
    fig.tight_layout()
    fig.savefig(png, dpi=110)
