"""Drawing Pathfinder scenes: contours grown paddle by paddle, then rendered; the task itself is `pathfinder`.

Construction (why it has no shortcut). Every image, whatever its label, is drawn from the same scene process:

1. contour 1 (``contour_length`` paddles) grows from a random start A to its end B, with ``|AB| >= seed_distance``;
2. a second walk from A is grown exactly like contour 1 but not drawn; its end is C (clear of contour 1);
3. contour 2 (same length) grows from C;
4. ``num_distractors`` contours of ``distractor_length`` paddles grow from free starts.

Only then does the label pick the second marker: B (positive: both ends of contour 1) or C (negative: one end of
contour 1 and one end of contour 2); the first marker is always A. So both classes draw the same contours of the
same lengths with the same ink, and B and C are both ends of walks from A: the marker distance and the second
marker's place have the same distribution in both classes. The scene keeps clear discs around A, B and C in both
classes. Contours never touch: a new paddle may not come within ``thickness + 1`` px of another stroke (checked on a
2x supersampled occupancy grid), which also forbids crossings that would make tracing ambiguous. A distractor that
finds no room after a few tries is left out, alike in both classes. The tests check that total ink, marker distance
and the second marker's distance to the border predict the label no better than chance. One weak local cue remains
(about 0.55 best-threshold accuracy at 64 px): a little more ink within two paddles of the second marker in
positives, because contour 1 grows on an empty canvas and contour 2 around it.

Coordinates are (x, y) in pixels, pixel ``(i, j)`` centred at ``x = j, y = i``. Generation is vectorised with numpy
over all images of a chunk (contours grow one paddle at a time for every image at once; strokes are rasterised in
one scatter-max of per-segment windows).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

_CANDIDATES = 16  # candidate turns per paddle, spread over the allowed range
_START_TRIES = 48  # start points tried per contour
_DISTRACTOR_TRIES = 3
_CONTOUR2_TRIES = 4
_MAX_ROUNDS = 200  # scene retries before giving up on a chunk
_PROBE_TURNS = np.array([-0.9, -0.45, 0.0, 0.45, 0.9])  # lookahead turns, in units of the largest turn
_LOOKAHEAD_TRIES = 4  # draws per paddle before one without lookahead room is accepted
_OCC_SCALE = 2  # occupancy grid supersampling: rounding error 0.35 px instead of 0.7


@dataclasses.dataclass(frozen=True)
class PathfinderParams:
    """One scene description at one resolution (all lengths in pixels, angles in radians).

    Attributes:
        img_size: image side.
        contour_length: paddles in each of the two marked contours.
        paddle_length: length of one paddle (dash).
        paddle_margin: (low, high) gap between paddles, drawn uniformly once per image.
        paddle_thickness: stroke width.
        marker_radius: radius of the marker discs.
        seed_distance: minimum distance between the two markers.
        continuity: smoothness; the largest turn between paddles is ``pi / (2 * continuity)`` radians.
        num_distractors: distractor contours per image.
        distractor_length: paddles per distractor contour.
        variant: ``lra`` or ``scaled``.
        defined_at: the resolution whose table row these parameters come from.
    """

    img_size: int
    contour_length: int
    paddle_length: float
    paddle_margin: tuple[float, float]
    paddle_thickness: float
    marker_radius: float
    seed_distance: float
    continuity: float
    num_distractors: int
    distractor_length: int
    variant: str
    defined_at: int



# ---------------------------------------------------------------------------------------------------------------
# geometry


def _windows(
    p0: np.ndarray, p1: np.ndarray, reach: float, max_len: float, scale: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Square windows of grid cells around segments, as indices and as offsets from each segment's start.

    Args:
        p0: (K, 2) segment starts, image pixels.
        p1: (K, 2) segment ends.
        reach: how far from the segment the window must cover, image pixels.
        max_len: upper bound of the segments' lengths.
        scale: grid cells per image pixel.

    Returns:
        gx (K, w) and gy (K, w) grid indices (may be out of range); rx (K, 1, w) and ry (K, w, 1), the cell centres
        minus ``p0`` in image pixels, laid out to broadcast to [k, y, x].
    """
    w = int(math.ceil((max_len + 2 * reach) * scale)) + 2
    lo = np.floor((np.minimum(p0, p1) - reach + 0.5) * scale - 0.5).astype(np.int64)  # (K, 2)
    offs = np.arange(w)
    gx = lo[:, 0:1] + offs  # (K, w)
    gy = lo[:, 1:2] + offs
    rx = ((gx + 0.5) / scale - 0.5).astype(np.float32)[:, None, :] - p0[:, 0, None, None].astype(np.float32)
    ry = ((gy + 0.5) / scale - 0.5).astype(np.float32)[:, :, None] - p0[:, 1, None, None].astype(np.float32)
    return gx, gy, rx, ry


def _segment_windows(
    p0: np.ndarray, p1: np.ndarray, reach: float, max_len: float, scale: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Squared distances from the cells of a window around each segment to that segment (see ``_windows``).

    Returns:
        gx (K, w), gy (K, w) and the squared distance (K, w, w) in image pixels, [k, y, x].
    """
    gx, gy, rx, ry = _windows(p0, p1, reach, max_len, scale)
    d = (p1 - p0).astype(np.float32)
    dx, dy = d[:, 0, None, None], d[:, 1, None, None]
    len2 = np.maximum(dx * dx + dy * dy, 1e-12)  # (K, 1, 1)
    t = np.clip((rx * dx + ry * dy) / len2, 0.0, 1.0)  # (K, w, w)
    ex = rx - t * dx
    ey = ry - t * dy
    return gx, gy, ex * ex + ey * ey


def _paddle_coverage(
    p0: np.ndarray, p1: np.ndarray, thickness: float, length: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Antialiased coverage of pixels by butt-capped paddles (a rectangle ``length`` x ``thickness`` each).

    The pixel is a unit box taken in the paddle's frame: coverage is the overlap of ``[s - 1/2, s + 1/2]`` with
    the paddle along its axis times the overlap of ``[e - 1/2, e + 1/2]`` with ``[-w/2, w/2]`` across it. Butt caps
    keep the gaps between paddles open, as in the original's PIL lines.

    Returns:
        gx (K, w), gy (K, w) and coverage (K, w, w) in [0, 1].
    """
    half = thickness / 2
    gx, gy, rx, ry = _windows(p0, p1, half + 1.0, length, 1)
    d = (p1 - p0).astype(np.float32)
    seg_len = np.maximum(np.sqrt((d * d).sum(-1)), 1e-6)[:, None, None]  # (K, 1, 1)
    ux, uy = d[:, 0, None, None] / seg_len, d[:, 1, None, None] / seg_len
    along = rx * ux + ry * uy  # (K, w, w)
    across = np.abs(ry * ux - rx * uy)
    cover_along = np.clip(np.minimum(along + 0.5, seg_len) - np.maximum(along - 0.5, 0.0), 0.0, 1.0)
    cover_across = np.clip(np.minimum(across + 0.5, half) - np.maximum(across - 0.5, -half), 0.0, 1.0)
    return gx, gy, cover_along * cover_across


def _stamp(
    occ: np.ndarray, rows: np.ndarray, p0: np.ndarray, p1: np.ndarray, radius: float, max_len: float
) -> None:
    """Mark occupancy cells within ``radius`` of one segment per row (a disc when ``p0 == p1``)."""
    gx, gy, dist2 = _segment_windows(p0, p1, radius, max_len, _OCC_SCALE)
    g = occ.shape[-1]
    hit = (dist2 <= radius * radius) & ((gy >= 0) & (gy < g))[:, :, None] & ((gx >= 0) & (gx < g))[:, None, :]
    flat = np.clip(gy, 0, g - 1)[:, :, None] * g + np.clip(gx, 0, g - 1)[:, None, :]  # (K, w, w)
    flat += (rows * (g * g))[:, None, None]
    occ.reshape(-1)[flat[hit]] = True


def _point_segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance from points ``p (..., 2)`` to segments ``a -> b (..., 2)``, broadcast."""
    d = b - a
    t = np.clip(((p - a) * d).sum(-1) / np.maximum((d * d).sum(-1), 1e-12), 0.0, 1.0)
    return np.linalg.norm(p - a - t[..., None] * d, axis=-1)


def _occupied(occ: np.ndarray, rows: np.ndarray, xy: np.ndarray) -> np.ndarray:
    """Whether the cells under points ``xy (m, ..., 2)`` are occupied in image ``rows[i]`` (off-grid: clipped)."""
    g = occ.shape[-1]
    cell = (xy + np.float32(0.5)) * np.float32(_OCC_SCALE)  # its floor is the nearest cell centre's index
    np.clip(cell, 0, g - 1, out=cell)
    cell = cell.astype(np.intp)
    flat = cell[..., 1] * g + cell[..., 0]
    flat += (rows * (g * g)).reshape((-1,) + (1,) * (xy.ndim - 2))
    return occ.reshape(-1)[flat]


def _inside(xy: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    return ((xy >= bounds[0]) & (xy <= bounds[1])).all(-1)


def _grow(
    occ: np.ndarray,
    rows: np.ndarray,
    start: np.ndarray,
    step: np.ndarray,
    length: int,
    p: PathfinderParams,
    bounds: tuple[float, float],
    clear: float,
    rng: np.random.Generator,
    *,
    start_clear: float | None = None,
    end_clear: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Grow one contour per row, all rows at once, committing its strokes to the occupancy grid.

    A step is accepted when its end stays in bounds and its centre line crosses no occupied cell. A contour's own
    last step is committed only after the next one is chosen, so a paddle never blocks its successor.

    Args:
        occ: (B, G, G) occupancy grid, updated in place.
        rows: (m,) the images of ``occ`` to grow in.
        start: (m, 2) first joint.
        step: (m,) distance between joints (paddle length + gap).
        length: paddles.
        p: scene parameters (for the continuity).
        bounds: (low, high) allowed joint coordinates.
        clear: stroke dilation in the occupancy grid.
        rng: random generator.
        start_clear: keep later paddles this far from the start point (a marker may sit there).
        end_clear: keep the end point this far from earlier paddles (a marker may sit there).

    Returns:
        points (m, length + 1, 2), the joints (end points included); ok (m,) where every step found room.
    """
    m = len(rows)
    ar = np.arange(m)
    pts = np.empty((m, length + 1, 2), dtype=np.float32)
    pts[:, 0] = start
    ok = np.ones(m, dtype=bool)
    if m == 0:
        return pts, ok
    heading = np.zeros(m, dtype=np.float32)
    step = step.astype(np.float32)
    max_step = float(step.max())
    # samples closer than the dilated band is wide, so no stroke slips between two of them
    n_samp = int(math.ceil(max_step / min(1.0, clear / 2)))
    frac = (np.arange(1, n_samp + 1, dtype=np.float32) / n_samp)[:, None]  # (S, 1) along the step, start excluded
    max_turn = math.pi / (2 * p.continuity)
    turns = (_PROBE_TURNS * max_turn).astype(np.float32)
    # look ahead far enough for the sharpest probe arc to turn around: a smooth contour needs that much room
    probe_depth = int(math.ceil(math.pi / (_PROBE_TURNS.max() * max_turn)))
    # a disc of radius (end_clear - clear) around the end free of occupied cells keeps strokes end_clear away
    ring_angles = np.linspace(0, 2 * math.pi, 12, endpoint=False)
    ring = np.concatenate([[[0.0, 0.0]], np.stack([np.cos(ring_angles), np.sin(ring_angles)], -1)])
    ring = (max((end_clear or 0.0) - clear, 0.0) * ring).astype(np.float32)  # (13, 2)
    for i in range(length):
        # Linsley's sampler, vectorised: candidate turns spread evenly (stratified, jittered) over the allowed range,
        # each weighted by cos(continuity * turn)^2 and by whether its paddle has room; one is drawn in proportion
        frac_turn = (rng.permuted(np.broadcast_to(np.arange(_CANDIDATES), (m, _CANDIDATES)), axis=1)
                     + rng.random((m, _CANDIDATES), dtype=np.float32)) / np.float32(_CANDIDATES)  # (m, M)
        if i == 0:
            ang = np.float32(2 * math.pi) * frac_turn
            weight = np.ones((m, _CANDIDATES), dtype=np.float32)
        else:
            turn = np.float32(max_turn) * (2 * frac_turn - 1)
            ang = heading[:, None] + turn
            weight = np.cos(np.float32(p.continuity) * turn) ** 2
        pos = pts[:, i]
        u = np.stack([np.cos(ang), np.sin(ang)], -1) * step[:, None, None]  # (m, M, 2) one step
        new = pos[:, None] + u  # (m, M, 2)
        samp = pos[:, None, None] + frac * u[:, :, None]  # (m, M, S, 2)
        valid = _inside(new, bounds) & ~_occupied(occ, rows, samp).any(-1)  # (m, M)
        if i == length - 1 and end_clear is not None:
            valid &= ~_occupied(occ, rows, new[:, :, None] + ring).any(-1)
        weight = weight * valid
        ok &= valid.any(1)
        pick = np.full(m, -1)
        last = np.zeros(m, dtype=np.int64)
        todo = np.flatnonzero(valid.any(1))
        # lookahead by rejection: a drawn candidate from which no arc of further turns has room is struck out
        # and another drawn, so contours steer away from walls and clutter before they are trapped (the same
        # bias in both classes); after a few strikes the last draw stands
        for _ in range(_LOOKAHEAD_TRIES):
            cum = np.cumsum(weight[todo], 1)  # (t, M)
            draw = (cum < rng.random(len(todo))[:, None] * cum[:, -1:]).sum(1)  # (t,)
            draw = np.minimum(draw, _CANDIDATES - 1)
            last[todo] = draw
            if i == length - 1:
                break
            a_pick = ang[todo, draw][:, None]  # (t, 1)
            room = np.ones((len(todo), len(turns)), dtype=bool)  # (t, P)
            probe = new[todo, draw][:, None]  # (t, 1, 2)
            for depth in range(1, probe_depth + 1):
                probe_ang = a_pick + depth * turns
                probe = probe + np.stack([np.cos(probe_ang), np.sin(probe_ang)], -1) * step[todo, None, None]
                room &= _inside(probe, bounds) & ~_occupied(occ, rows[todo], probe)
            good = room.any(1)
            pick[todo[good]] = draw[good]
            weight[todo[~good], draw[~good]] = 0.0
            todo = todo[~good]
            todo = todo[weight[todo].sum(1) > 0]
            if len(todo) == 0:
                break
        pick = np.where(pick >= 0, pick, last)
        pts[:, i + 1] = new[ar, pick]
        heading = ang[ar, pick]
        if i >= 1:
            _stamp(occ, rows, pts[:, i - 1], pts[:, i], clear, max_step)
        if i == 1 and start_clear is not None:
            _stamp(occ, rows, pts[:, 0], pts[:, 0], start_clear, 0.0)
    _stamp(occ, rows, pts[:, length - 1], pts[:, length], clear, max_step)
    return pts, ok


def _free_starts(
    occ: np.ndarray, rows: np.ndarray, bounds: tuple[float, float], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A random unoccupied start point per row; ok is False where none of the tries was free."""
    m = len(rows)
    cand = rng.uniform(bounds[0], bounds[1], (m, _START_TRIES, 2)).astype(np.float32)
    free = ~_occupied(occ, rows, cand)
    pick = free.argmax(1)
    return cand[np.arange(m), pick], free.any(1)


def _scene_attempt(p: PathfinderParams, m: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Draw ``m`` scenes at once and return those that satisfied every constraint (possibly fewer than ``m``).

    Scenes that fail a stage are dropped before the next one, so no work is spent finishing them.
    """
    r = p.img_size
    g = r * _OCC_SCALE
    pad = p.marker_radius + 1.0
    bounds = (pad, r - 1 - pad)
    clear = p.paddle_thickness + 1.0  # centre lines at least this far apart: strokes never touch
    mark_clear = p.marker_radius + p.paddle_thickness / 2 + 1.0  # a marker never touches a foreign stroke
    length = p.contour_length
    occ = np.zeros((m, g, g), dtype=bool)
    margin = rng.uniform(p.paddle_margin[0], p.paddle_margin[1], m)
    step = p.paddle_length + margin

    a = rng.uniform(bounds[0], bounds[1], (m, 2))
    c1, ok = _grow(
        occ, np.arange(m), a, step, length, p, bounds, clear, rng, start_clear=mark_clear, end_clear=mark_clear
    )
    b = c1[:, -1]
    ok &= np.linalg.norm(b - a, axis=-1) >= p.seed_distance
    # markers A and B must be clear of their own contour except for the paddle they cap
    ok &= _point_segment_distance(a[:, None], c1[:, 1:-1], c1[:, 2:]).min(1) >= mark_clear
    ok &= _point_segment_distance(b[:, None], c1[:, :-2], c1[:, 1:-1]).min(1) >= mark_clear
    occ, margin, step, a, b, c1 = (v[ok] for v in (occ, margin, step, a, b, c1))
    m = len(a)
    rows = np.arange(m)
    for centre in (a, b):
        _stamp(occ, rows, centre, centre, mark_clear, 0.0)

    # contour 2, retried on the same contour 1 when it finds no room (cheaper than redrawing the scene)
    before = occ.copy()
    c = np.zeros((m, 2), dtype=np.float32)
    c2 = np.zeros_like(c1)
    done = np.zeros(m, dtype=bool)
    for _ in range(_CONTOUR2_TRIES):
        todo = np.flatnonzero(~done)
        if len(todo) == 0:
            break
        # C: the end of a second, undrawn walk from A grown like contour 1, so the second marker's place (and
        # its distance to A) has the same distribution whether it ends contour 1 (B) or starts contour 2 (C)
        ghost, found = _grow(
            np.zeros((len(todo), g, g), dtype=bool), np.arange(len(todo)), a[todo], step[todo], length, p, bounds,
            clear, rng, start_clear=mark_clear, end_clear=mark_clear,
        )
        start = ghost[:, -1]
        found &= np.linalg.norm(start - a[todo], axis=-1) >= p.seed_distance
        found &= _point_segment_distance(start[:, None], c1[todo, :-1], c1[todo, 1:]).min(1) >= mark_clear
        todo, start = todo[found], start[found]
        pts, grown = _grow(occ, todo, start, step[todo], length, p, bounds, clear, rng, start_clear=mark_clear)
        grown &= _point_segment_distance(start[:, None], pts[:, 1:-1], pts[:, 2:]).min(1) >= mark_clear
        occ[todo[~grown]] = before[todo[~grown]]
        c[todo[grown]], c2[todo[grown]], done[todo[grown]] = start[grown], pts[grown], True
    del before
    occ, margin, step, c, c1, c2 = (v[done] for v in (occ, margin, step, c, c1, c2))
    m = len(c)
    _stamp(occ, np.arange(m), c, c, mark_clear, 0.0)

    nd, ld = p.num_distractors, p.distractor_length
    dist_pts = np.zeros((m, nd, ld + 1, 2))
    drawn = np.zeros((m, nd), dtype=bool)
    for j in range(nd):
        for _ in range(_DISTRACTOR_TRIES):
            todo = np.flatnonzero(~drawn[:, j])
            if len(todo) == 0:
                break
            start, found = _free_starts(occ, todo, bounds, rng)
            todo, start = todo[found], start[found]
            if len(todo) == 0:
                continue
            pts, grown = _grow(occ, todo, start, step[todo], ld, p, bounds, clear, rng)
            dist_pts[todo[grown], j] = pts[grown]
            drawn[todo[grown], j] = True
    return {"c1": c1, "c2": c2, "distractors": dist_pts, "drawn": drawn, "margin": margin}


def draw_scenes(p: PathfinderParams, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` valid scenes: failed ones are redrawn until all succeed."""
    parts: list[dict[str, np.ndarray]] = []
    have = 0
    rate = 0.7  # a typical share of scenes that satisfy every constraint
    for _ in range(_MAX_ROUNDS):
        need = n - have
        # overdraw by the success rate seen so far, so the last stragglers do not take many rounds
        draw = min(int(need / rate * 1.1) + 4, 4 * need + 16)
        got = _scene_attempt(p, draw, rng)
        rate = max(len(got["c1"]) / draw, 0.05)
        got = {k: v[:need] for k, v in got.items()}
        parts.append(got)
        have += len(got["c1"])
        if have == n:
            return {k: np.concatenate([part[k] for part in parts]) for k in got}
    raise RuntimeError(
        f"pathfinder: could not place {n - have} of {n} scenes in {_MAX_ROUNDS} rounds with {p}; "
        "the contours do not fit the image: shorten them or lower the distractor count"
    )


def render_scenes(p: PathfinderParams, scenes: dict[str, np.ndarray], labels: np.ndarray) -> np.ndarray:
    """Rasterise all paddles and markers of all images with antialiasing, max-composited, to uint8."""
    n = len(labels)
    r = p.img_size
    margin = scenes["margin"]

    # paddles: every step shrunk by half the gap at each end
    joints = [scenes["c1"], scenes["c2"]]
    masks = [np.ones((n, 1), bool), np.ones((n, 1), bool)]
    for j in range(p.num_distractors):
        joints.append(scenes["distractors"][:, j])
        masks.append(scenes["drawn"][:, j : j + 1])
    a_list, b_list, img_list = [], [], []
    for pts, mask in zip(joints, masks, strict=True):
        s0, s1 = pts[:, :-1], pts[:, 1:]  # (n, L, 2)
        u = (s1 - s0) / np.maximum(np.linalg.norm(s1 - s0, axis=-1, keepdims=True), 1e-9)  # undrawn: zeros
        shrink = (margin / 2)[:, None, None] * u
        keep = np.broadcast_to(mask, s0.shape[:2])
        a_list.append((s0 + shrink)[keep])
        b_list.append((s1 - shrink)[keep])
        img_list.append(np.broadcast_to(np.arange(n)[:, None], s0.shape[:2])[keep])
    p0 = np.concatenate(a_list)
    p1 = np.concatenate(b_list)
    seg_img = np.concatenate(img_list)

    second = np.where(labels[:, None] == 1, scenes["c1"][:, -1], scenes["c2"][:, 0])
    centres = np.concatenate([scenes["c1"][:, 0], second])  # (2n, 2)
    centre_img = np.concatenate([np.arange(n), np.arange(n)])

    canvas = np.zeros(n * r * r, dtype=np.float32)
    chunk = 1 << 16
    for q0, q1, owner, disc in ((p0, p1, seg_img, False), (centres, centres, centre_img, True)):
        for s in range(0, len(q0), chunk):
            sl = slice(s, s + chunk)
            if disc:
                gx, gy, dist2 = _segment_windows(q0[sl], q1[sl], p.marker_radius + 1.0, 0.0, 1)
                val = np.clip(p.marker_radius + 0.5 - np.sqrt(dist2), 0.0, 1.0)
            else:
                gx, gy, val = _paddle_coverage(q0[sl], q1[sl], p.paddle_thickness, p.paddle_length)
            inside = (val > 0) & ((gy >= 0) & (gy < r))[:, :, None] & ((gx >= 0) & (gx < r))[:, None, :]
            k, yy, xx = np.nonzero(inside)
            flat = (owner[sl][k] * r + gy[k, yy]) * r + gx[k, xx]
            np.maximum.at(canvas, flat, val[k, yy, xx])
    return np.rint(canvas.reshape(n, r, r) * 255).astype(np.uint8)


