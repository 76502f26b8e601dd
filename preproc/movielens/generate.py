"""Small synthetic MovieLens ratings in the real ml-1m / ml-20m file layouts.

So that tests and new users run the NCF preprocessing with no download. The
shape follows the real data: ratings per user heavy-tailed (a few users rate a
lot, some fall below the 20-rating filter), item popularity a power law (Zipf),
sparse original item ids (the real ids have gaps, so re-indexing matters),
timestamps in the dataset's real collection period with each user's ratings
clustered in a few sessions, and a small fraction of repeated (user, item)
pairs with a later timestamp so the de-duplication has work to do.

Layouts written:
- ml-1m:  ``ratings.dat``, ``UserID::MovieID::Rating::Timestamp``, no header,
  integer stars 1-5, Unix seconds.
- ml-20m: ``ratings.csv``, header ``userId,movieId,rating,timestamp``, half
  stars 0.5-5.0, Unix seconds.
"""
from __future__ import annotations

import os

import numpy as np

from preproc.movielens.format import LAYOUTS

# First and last timestamp of each dataset's real collection period.
PERIODS = {"ml-1m": (956703932, 1046454590), "ml-20m": (789652009, 1427784002)}


def generate(out_dir: str, users: int = 1000, items: int = 500, fmt: str = "ml-1m",
             seed: int = 0, mean_ratings: float = 40.0, duplicate_fraction: float = 0.005) -> str:
    """Write one ratings file under ``out_dir``; returns its path."""
    if fmt not in LAYOUTS:
        raise ValueError(f"--format: unknown MovieLens format {fmt!r} (ml-1m or ml-20m)")
    if users < 1 or items < 2:
        raise ValueError("--users must be >= 1 and --items >= 2")
    name, sep, header = LAYOUTS[fmt]
    t_first, t_last = PERIODS[fmt]
    rng = np.random.default_rng(seed)
    # Sparse original ids: a sorted sample of a range twice as wide.
    item_ids = np.sort(rng.choice(np.arange(1, 2 * items + 1), size=items, replace=False))
    popularity = 1.0 / np.arange(1, items + 1) ** 1.1
    popularity = rng.permutation(popularity)  # popular items are not the low ids
    popularity /= popularity.sum()
    # Heavy-tailed ratings per user (lognormal), at least 5, at most half the items
    # (so every user keeps unseen items to draw test negatives from).
    counts = np.clip(rng.lognormal(np.log(mean_ratings) - 0.5, 1.0, size=users), 5, max(5, items // 2)).astype(int)
    star_values = np.arange(1, 6) if fmt == "ml-1m" else np.arange(1, 11) / 2.0
    star_probs = np.linspace(1, 3, len(star_values)) ** 1.5
    star_probs /= star_probs.sum()

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        if header:
            f.write(header + "\n")
        for user in range(1, users + 1):
            n = int(counts[user - 1])
            chosen = rng.choice(items, size=n, replace=False, p=popularity)
            # Sessions: a start day in the period, ratings within a few hours of it.
            sessions = rng.integers(t_first, t_last - 86400, size=max(1, n // 25 + 1))
            ts = sessions[rng.integers(0, len(sessions), size=n)] + rng.integers(0, 4 * 3600, size=n)
            stars = rng.choice(star_values, size=n, p=star_probs)
            n_dup = rng.binomial(n, duplicate_fraction)
            dup = rng.integers(0, n, size=n_dup)
            rows = [(item_ids[c], s, t) for c, s, t in zip(chosen, stars, ts)]
            rows += [(item_ids[chosen[d]], star_values[-1], ts[d] + 3600) for d in dup]
            rows.sort(key=lambda r: r[2])
            for item, star, t in rows:
                star_txt = f"{int(star)}" if fmt == "ml-1m" else f"{star:.1f}"
                f.write(f"{user}{sep}{item}{sep}{star_txt}{sep}{t}\n")
    os.replace(tmp, path)
    return path
