"""Draw the pyloader architecture figure shown at the top of the README.

Run from anywhere (no network needed)::

    python img/draw_architecture.py

The PNG is written next to this script as ``architecture.png``.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_PATH = os.path.join(HERE, "architecture.png")

FIG_W, FIG_H = 12.0, 5.5
DPI = 150

TEXT = "#1f2933"
MUTED = "#52606d"
ARROW = "#3e4c59"

TITLE_SIZE = 10.5
BODY_SIZE = 8.6
MONO_SCALE = 0.94  # DejaVu Sans Mono looks larger than DejaVu Sans

MONO = "DejaVu Sans Mono"
SANS = "DejaVu Sans"

# (title, body lines, face colour, edge colour).
# In body lines, `backticked` parts are drawn in a monospace font and an
# empty string is a short vertical gap.
STAGES = [
    (
        "FileSource",
        [
            "lists chunk files",
            "(folder / glob / list /",
            "fsspec URL)",
            "",
            "per-epoch seeded",
            "shuffle of file order",
            "",
            "rank sharding",
        ],
        "#e3f4e8",
        "#3f9b5a",
    ),
    (
        "ReadFiles",
        [
            "`DataReader.read_file`",
            "/ `iter_file` in an",
            "executor or worker",
            "processes",
            "",
            "up to `prefetch_files`",
            "files in flight, results",
            "kept in file order",
            "",
            "in-file seeded shuffle",
        ],
        "#e1effb",
        "#3b7dc4",
    ),
    (
        "Batcher",
        [
            "file tails join",
            "the next file",
            "",
            "optional",
            "`shuffle_buffer`",
            "mixes files",
            "",
            "`drop_last`",
            "",
            "stream mode:",
            "one row per file",
            "",
            "groups of 1..32",
            "batches onwards",
        ],
        "#efe6f8",
        "#8254b8",
    ),
    (
        "Encode",
        [
            "`Dataset`",
            "`.batch_encode`",
            "",
            "(executor /",
            "worker processes;",
            "one request",
            "per group)",
        ],
        "#fdeedd",
        "#d9822b",
    ),
    (
        "Collate",
        [
            "`DataCollator`",
            "`.collate_batch`",
            "",
            "(+ `pin_memory` /",
            "`device`)",
        ],
        "#dff3f1",
        "#2a9d8f",
    ),
    (
        "Hand-over queue",
        [
            "bounded by",
            "`max_queue_size`",
            "batches; handed",
            "out one by one",
        ],
        "#eceff3",
        "#616e7c",
    ),
]


def rounded_box(ax, x, y, w, h, *, fc, ec, lw=1.4, ls="-", pad=0.02,
                radius=0.08, z=2):
    box = FancyBboxPatch(
        (x, y), w, h,
        boxstyle=f"round,pad={pad},rounding_size={radius}",
        facecolor=fc, edgecolor=ec, linewidth=lw, linestyle=ls, zorder=z,
    )
    ax.add_patch(box)
    return box


def arrow(ax, start, end, *, color=ARROW, lw=1.6, style="-|>", z=3,
          ls="-", mutation_scale=13):
    ax.add_patch(
        FancyArrowPatch(
            start, end, arrowstyle=style, mutation_scale=mutation_scale,
            color=color, linewidth=lw, linestyle=ls, zorder=z,
            shrinkA=0, shrinkB=0,
        )
    )


def queue_glyph(ax, cx, cy, *, slots=3, slot_w=0.075, slot_h=0.30):
    """A small bounded queue: a few stacked slots sitting on the arrow."""
    x0 = cx - slots * slot_w / 2
    for i in range(slots):
        fill = "#ffffff" if i == 0 else "#cbd2d9"
        ax.add_patch(
            Rectangle(
                (x0 + i * slot_w, cy - slot_h / 2), slot_w, slot_h,
                facecolor=fill, edgecolor="#52606d", linewidth=1.0, zorder=5,
            )
        )
    return x0, x0 + slots * slot_w


def _measure(ax, renderer, text, size, family, weight):
    """Width of ``text`` in data units (1 data unit == 1 inch here)."""
    t = ax.text(0, 0, text, fontsize=size, family=family, fontweight=weight)
    width = t.get_window_extent(renderer).width / DPI
    t.remove()
    return width


def rich_line(ax, renderer, cx, y, line, *, size=BODY_SIZE, color=TEXT,
              weight="normal", ha="center", z=4):
    """Draw one line where `backticked` parts use a monospace font.

    ``y`` is the baseline. Returns the line width in data units.
    """
    parts = line.split("`")
    pieces = []  # (text, family, leading_space, trailing_space)
    for i, part in enumerate(parts):
        if not part:
            continue
        family = MONO if i % 2 else SANS
        core = part.strip(" ")
        lead = len(part) - len(part.lstrip(" "))
        trail = len(part) - len(part.rstrip(" "))
        pieces.append((core, family, lead, trail))

    space = {
        fam: (_measure(ax, renderer, "a a", size, fam, weight)
              - _measure(ax, renderer, "aa", size, fam, weight))
        for fam in (SANS, MONO)
    }
    layout = []
    total = 0.0
    for core, family, lead, trail in pieces:
        total += lead * space[family]
        fsize = size * MONO_SCALE if family == MONO else size
        w = _measure(ax, renderer, core, fsize, family, weight) if core else 0
        layout.append((total, core, family, fsize))
        total += w + trail * space[family]

    x0 = cx - total / 2 if ha == "center" else cx
    for offset, core, family, fsize in layout:
        if core:
            ax.text(x0 + offset, y, core, fontsize=fsize, family=family,
                    fontweight=weight, color=color, ha="left",
                    va="baseline", zorder=z)
    return total


def rich_block(ax, renderer, cx, top, lines, *, size=BODY_SIZE, color=TEXT,
               pitch=1.42, blank=0.6):
    """Stack ``lines`` under ``top`` with a fixed line pitch.

    Returns (bottom y, widest line width).
    """
    step = size * pitch / 72.0
    y = top - size * 0.95 / 72.0  # first baseline
    widest = 0.0
    for line in lines:
        if not line:
            y -= step * blank
            continue
        widest = max(widest, rich_line(ax, renderer, cx, y, line, size=size,
                                       color=color))
        y -= step
    return y + step, widest


def main() -> None:
    fig = plt.figure(figsize=(FIG_W, FIG_H), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, FIG_W)
    ax.set_ylim(0, FIG_H)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.patch.set_facecolor("white")
    renderer = fig.canvas.get_renderer()

    # ---- caption + corner note -------------------------------------------
    ax.text(0.18, 5.22, "pyloader pipeline", fontsize=14, fontweight="bold",
            color=TEXT, ha="left", va="center")

    note_w, note_h = 3.55, 0.34
    note_x, note_y = FIG_W - 0.18 - note_w, 5.22 - note_h / 2
    rounded_box(ax, note_x, note_y, note_w, note_h, fc="#fff8db",
                ec="#c9a227", lw=1.1, radius=0.06)
    rich_line(ax, renderer, note_x + note_w / 2, 5.22 - 0.045,
              "`state_dict()`: taken at the point of consumption", size=8.8)

    # ---- asyncio event loop background -----------------------------------
    loop_x, loop_y, loop_w, loop_h = 0.14, 2.02, FIG_W - 0.28, 2.86
    rounded_box(ax, loop_x, loop_y, loop_w, loop_h, fc="#f5f7fa",
                ec="#9aa5b1", lw=1.3, radius=0.18, z=0)
    ax.text(loop_x + 0.16, loop_y + loop_h - 0.17,
            "asyncio event loop (background thread)", fontsize=10.5,
            fontstyle="italic", fontweight="bold", color=MUTED,
            ha="left", va="center", zorder=1)

    # ---- main row of stages ----------------------------------------------
    n = len(STAGES)
    row_left, row_right = loop_x + 0.16, loop_x + loop_w - 0.16
    gap = 0.42
    box_w = (row_right - row_left - gap * (n - 1)) / n
    box_y, box_h = 2.2, 2.3
    title_y = box_y + box_h - 0.2
    mid_y = box_y + box_h / 2

    centers = []
    for i, (title, body, fc, ec) in enumerate(STAGES):
        x = row_left + i * (box_w + gap)
        rounded_box(ax, x, box_y, box_w, box_h, fc=fc, ec=ec, lw=1.6)
        ax.text(x + box_w / 2, title_y, title, fontsize=TITLE_SIZE,
                fontweight="bold", color=ec, ha="center", va="center",
                zorder=4)
        ax.plot([x + 0.12, x + box_w - 0.12], [title_y - 0.19] * 2,
                color=ec, linewidth=0.8, alpha=0.6, zorder=4)
        _, widest = rich_block(ax, renderer, x + box_w / 2, title_y - 0.3,
                               body)
        if widest > box_w - 0.12:
            print(f"warning: text too wide in {title!r}: {widest:.2f}")
        centers.append(x + box_w / 2)

    # arrows + bounded queues between consecutive stages
    queue_y = mid_y + 0.35
    for i in range(n - 1):
        x_end = row_left + i * (box_w + gap) + box_w + 0.02
        x_next = row_left + (i + 1) * (box_w + gap) - 0.02
        arrow(ax, (x_end, queue_y), (x_next, queue_y))
        qx0, qx1 = queue_glyph(ax, (x_end + x_next) / 2 - 0.03, queue_y)
        if i == 3:
            # label one of the queues from above, with a thin leader line
            cx = (qx0 + qx1) / 2
            ax.plot([cx, cx], [queue_y + 0.17, box_y + box_h + 0.1],
                    color=MUTED, linewidth=0.8, zorder=1)
            ax.text(cx, box_y + box_h + 0.16, "bounded asyncio.Queue",
                    fontsize=8.6, fontstyle="italic", color=MUTED,
                    ha="center", va="bottom", zorder=1)

    # ---- consumer, outside the loop --------------------------------------
    cons_w, cons_h = 2.25, 1.2
    cons_x = FIG_W - 0.14 - cons_w
    cons_y = 0.3
    rounded_box(ax, cons_x, cons_y, cons_w, cons_h, fc="#ffffff",
                ec="#1f2933", lw=1.8)
    ax.text(cons_x + cons_w / 2, cons_y + cons_h - 0.2, "consumer",
            fontsize=TITLE_SIZE, fontweight="bold", color=TEXT,
            ha="center", va="center", zorder=4)
    rich_block(ax, renderer, cons_x + cons_w / 2, cons_y + cons_h - 0.4,
               ["`for batch in loader`", "/  `async for`  /",
                "`tf.data.Dataset`"], size=BODY_SIZE + 0.4)
    arrow(ax, (centers[-1], box_y - 0.02), (centers[-1], cons_y + cons_h + 0.02),
          lw=2.0, mutation_scale=16)
    ax.text(centers[-1] + 0.1, (loop_y + cons_y + cons_h) / 2, "batches",
            fontsize=8.6, fontstyle="italic", color=MUTED, ha="left",
            va="center", zorder=4,
            bbox=dict(boxstyle="round,pad=0.12", fc="white", ec="none"))

    # a wider queue drawn inside the hand-over box: some slots hold batches
    hx = centers[-1]
    slots, slot_w, slot_h = 6, 0.17, 0.42
    hq_x0 = hx - slots * slot_w / 2
    hq_y = box_y + 0.5
    for k in range(slots):
        filled = k >= 2
        ax.add_patch(
            Rectangle(
                (hq_x0 + k * slot_w, hq_y), slot_w, slot_h,
                facecolor="#9aa5b1" if filled else "#ffffff",
                edgecolor="#52606d", linewidth=1.0, zorder=5,
            )
        )
    ax.text(hx, hq_y - 0.1, "ready batches", fontsize=8.2,
            fontstyle="italic", color=MUTED, ha="center", va="top",
            zorder=5)

    # ---- worker processes -------------------------------------------------
    wk_x0 = row_left + 1 * (box_w + gap) - 0.05
    wk_x1 = row_left + 3 * (box_w + gap) + box_w + 0.05
    wk_y, wk_h = 0.3, 0.95
    rounded_box(ax, wk_x0, wk_y, wk_x1 - wk_x0, wk_h, fc="#fbfcfd",
                ec="#7b8794", lw=1.4, ls=(0, (5, 3)), radius=0.12)
    ax.text((wk_x0 + wk_x1) / 2, wk_y + wk_h - 0.2,
            "worker processes (num_workers=N)", fontsize=10,
            fontweight="bold", color=MUTED, ha="center", va="center",
            zorder=4)
    # little process tokens
    labels = ["proc 0", "proc 1", "…", "proc N-1"]
    tok_w, tok_h, tok_gap = 0.78, 0.32, 0.16
    total = len(labels) * tok_w + (len(labels) - 1) * tok_gap
    tx = (wk_x0 + wk_x1) / 2 - total / 2
    for lab in labels:
        if lab == "…":
            ax.text(tx + tok_w / 2, wk_y + 0.26, "…", fontsize=12,
                    color=MUTED, ha="center", va="center", zorder=4)
        else:
            rounded_box(ax, tx, wk_y + 0.1, tok_w, tok_h, fc="#e4e7eb",
                        ec="#9aa5b1", lw=0.9, radius=0.05, z=3)
            ax.text(tx + tok_w / 2, wk_y + 0.1 + tok_h / 2, lab,
                    fontsize=8.3, color=TEXT, ha="center", va="center",
                    zorder=4)
        tx += tok_w + tok_gap

    # shared-memory links to ReadFiles and Encode
    for idx in (1, 3):
        cx = centers[idx]
        arrow(ax, (cx, wk_y + wk_h + 0.02), (cx, box_y - 0.02),
              style="<|-|>", color="#7b8794", lw=1.4, ls=(0, (4, 2)))
        ax.text(cx + 0.1, (wk_y + wk_h + box_y) / 2,
                "shared memory\n(zero-copy arrays)", fontsize=8.2,
                fontstyle="italic", color=MUTED, ha="left", va="center",
                linespacing=1.2, zorder=4,
                bbox=dict(boxstyle="round,pad=0.12", fc="white", ec="none"))

    fig.savefig(OUT_PATH, dpi=DPI, facecolor="white")
    plt.close(fig)
    print(f"wrote {OUT_PATH}")


if __name__ == "__main__":
    main()
