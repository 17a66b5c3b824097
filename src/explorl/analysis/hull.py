"""The geometry of a pass@1–pass@k frontier: points (x, y) = (mean pass@1, mean pass@k), one per
learning rate of a method.

- The **upper concave hull** of the points (sorted by pass@1, linear between hull vertices): a
  learning rate whose point lies below the chord of two others is beaten by a mix of them and
  does not shape the frontier, so a non-monotone sweep needs no special case.
- Its **Pareto part** F(x): the most pass@k the hull reaches at a pass@1 of at least x, flat at
  the hull's highest pass@k left of the point that reaches it (the *peak*), then the hull's
  falling edge. G(y) = max{x′ : F(x′) ≥ y} is the reverse: the most pass@1 at pass@k ≥ y.
- Its **non-dominated part** (``pareto``): the hull's vertices from the peak rightwards, the
  points no other point or mix beats on both axes; a frontier judged against another method's
  points starts there, so that its pass@1 range does not begin at a point its own peak beats.
- A point is **beaten by its own method** when F of the method's points at its pass@1 exceeds
  its pass@k: another learning rate (or a mix of two) of the same method has at least its pass@1
  and more pass@k. Such a point is not part of the frontier the method reaches (``beaten_by``).

F and G are defined on the points' own ranges only: no extrapolation. Used by the study's
frontier comparison (``explorl.report.frontier``) and the frontier figure
(``explorl.analysis.frontier``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hull:
    """A method's frontier: the upper concave hull's vertices, sorted by pass@1, each with the
    index of the point it is (into the points the hull was built from)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    idx: tuple[int, ...]

    @property
    def peak(self) -> int:
        """The vertex with the most pass@k (the rightmost of equal ones)."""
        top = max(self.ys)
        return max(i for i, y in enumerate(self.ys) if y == top)


def upper_hull(xs, ys) -> Hull:
    """The upper concave hull of points (x, y) (Andrew's monotone chain; of equal x the highest
    y; collinear middle points dropped)."""
    best: dict[float, int] = {}
    for i, (x, y) in enumerate(zip(xs, ys)):
        if x not in best or y > ys[best[x]]:
            best[float(x)] = i
    order = sorted(best.values(), key=lambda i: xs[i])
    hull: list[int] = []
    for i in order:
        while len(hull) >= 2:
            o, a = hull[-2], hull[-1]
            cross = (xs[a] - xs[o]) * (ys[i] - ys[o]) - (ys[a] - ys[o]) * (xs[i] - xs[o])
            if cross < 0:  # a clockwise turn: a stays on the upper hull
                break
            hull.pop()
        hull.append(i)
    return Hull(tuple(float(xs[i]) for i in hull), tuple(float(ys[i]) for i in hull), tuple(hull))


def pareto(h: Hull) -> Hull:
    """The non-dominated part of a hull: its vertices from the peak (the most pass@k) to the
    most pass@1. Its pass@1 range starts at the peak, so F is never flat on it."""
    p = h.peak
    return Hull(h.xs[p:], h.ys[p:], h.idx[p:])


def frontier_edge(h: Hull, x: float) -> tuple[int, int, float, float] | None:
    """F(x) as a mix of two hull vertices: (i, j, t, slope) with F(x) = (1 − t)·y_i + t·y_j and
    F′(x) = slope; None outside [min, max] pass@1. Left of the peak, F is the peak's pass@k."""
    if not h.xs[0] <= x <= h.xs[-1]:
        return None
    p = h.peak
    if x <= h.xs[p]:
        return p, p, 0.0, 0.0
    j = next(j for j in range(p + 1, len(h.xs)) if x <= h.xs[j])
    i = j - 1
    t = (x - h.xs[i]) / (h.xs[j] - h.xs[i])
    return i, j, t, (h.ys[j] - h.ys[i]) / (h.xs[j] - h.xs[i])


def frontier_at(h: Hull, x: float) -> float | None:
    """F(x): the most pass@k the hull reaches at a pass@1 of at least x; None outside its
    pass@1 range."""
    e = frontier_edge(h, x)
    return None if e is None else (1 - e[2]) * h.ys[e[0]] + e[2] * h.ys[e[1]]


def pass1_edge(h: Hull, y: float) -> tuple[int, int, float, float] | None:
    """G(y) as a mix of two vertices of the hull's falling edge: (i, j, u, dx/dy) with G(y) =
    (1 − u)·x_i + u·x_j; None when y is above the peak or below F at the largest pass@1."""
    p = h.peak
    if not h.ys[-1] <= y <= h.ys[p]:
        return None
    for j in range(len(h.ys) - 1, p, -1):  # from the right: the largest x that keeps y
        i = j - 1
        if h.ys[j] <= y <= h.ys[i]:
            if y == h.ys[j]:
                return j, j, 0.0, 0.0
            u = (y - h.ys[i]) / (h.ys[j] - h.ys[i])
            return i, j, u, (h.xs[j] - h.xs[i]) / (h.ys[j] - h.ys[i])
    return p, p, 0.0, 0.0  # the falling edge is the peak alone, at y = its pass@k


def pass1_at(h: Hull, y: float) -> float | None:
    """G(y): the most pass@1 the hull reaches while keeping pass@k ≥ y; None outside."""
    e = pass1_edge(h, y)
    return None if e is None else (1 - e[2]) * h.xs[e[0]] + e[2] * h.xs[e[1]]


def dominated(h: Hull, x: float, y: float) -> bool:
    """Whether some mix of the hull's points has pass@1 ≥ x and pass@k ≥ y (inside its reach);
    a point that is not lies outside the frontier."""
    if x > h.xs[-1]:
        return False
    p = h.peak
    return y <= (h.ys[p] if x <= h.xs[p] else frontier_at(h, x))


def where(h: Hull, x: float) -> str:
    """``inside``, or which side of the hull's pass@1 range x lies on (the study's words:
    the hull is GRPO's)."""
    if x < h.xs[0]:
        return "below GRPO's pass@1 range"
    return "above GRPO's pass@1 range" if x > h.xs[-1] else "inside"


def beaten_by(xs, ys) -> list[tuple[int, ...] | None]:
    """For each point of one method, the indices of its own points that beat it (the hull vertex
    at F(x), or the two whose mix does), or None where it lies on its own frontier (F(x) = y,
    collinear points included). A point left of the peak is beaten by the peak alone."""
    h = upper_hull(xs, ys)
    out: list[tuple[int, ...] | None] = []
    for x, y in zip(xs, ys):
        i, j, t, _ = frontier_edge(h, float(x))
        f = (1 - t) * h.ys[i] + t * h.ys[j]
        if y >= f - 1e-12 * max(1.0, abs(f)):
            out.append(None)
        elif i == j or t == 0.0:
            out.append((h.idx[i],))
        elif t == 1.0:
            out.append((h.idx[j],))
        else:
            out.append((h.idx[i], h.idx[j]))
    return out
