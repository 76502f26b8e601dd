"""Small synthetic Outbrain Click Prediction tables in the real Kaggle CSV layouts.

So that tests and new users run the Wide & Deep preprocessing with no download.
All eight tables the pipeline reads are written with their Kaggle headers:

==========================  ===================================================
file                        columns
==========================  ===================================================
clicks_train.csv            display_id,ad_id,clicked
events.csv                  display_id,uuid,document_id,timestamp,platform,geo_location
promoted_content.csv        ad_id,document_id,campaign_id,advertiser_id
documents_meta.csv          document_id,source_id,publisher_id,publish_time
documents_categories.csv    document_id,category_id,confidence_level
documents_topics.csv        document_id,topic_id,confidence_level
documents_entities.csv      document_id,entity_id,confidence_level
page_views.csv              uuid,document_id,timestamp,platform,geo_location,traffic_source
==========================  ===================================================

Shape of the real data that matters to the pipeline: event timestamps are ms
since the Outbrain epoch 1465876799998 and span 13 days (display ids grow with
time), one event in eleven has no clicks (a Kaggle test display); every display
of clicks_train shows 2-12 ads and exactly one is clicked; ads, documents,
campaigns, users and countries follow power laws (Zipf); some documents lack a
source, publisher, publish time, topics or entities; some events lack a
platform (``\\N``) or a geo location. Clicks carry a signal (ad quality and
page/ad category overlap) so a model can learn something.
"""
from __future__ import annotations

import os

import numpy as np

from preproc.outbrain.tables import DAY_MS, TABLES, header_of

DAYS = 13
COUNTRIES = ["US", "GB", "CA", "AU", "IN", "DE", "PH", "ZA", "FR", "SG", "NZ", "IE", "MY", "NG", "BR"]
US_STATES = ["CA", "TX", "FL", "NY", "PA", "IL", "OH", "GA", "NC", "MI", "NJ", "VA", "WA", "AZ", "MA"]


class _Zipf:
    """Draws from 0..n-1 with probability ~ 1/(rank+1)^a; which value has which rank is fixed per instance."""

    def __init__(self, rng, n: int, a: float = 1.2):
        self.rng, self.n = rng, n
        self.p = 1.0 / np.arange(1, n + 1) ** a
        self.p /= self.p.sum()
        self.order = rng.permutation(n)

    def __call__(self, size: int) -> np.ndarray:
        return self.order[self.rng.choice(self.n, size=size, p=self.p)]


def _write(out_dir: str, table: str, lines) -> None:
    path = os.path.join(out_dir, f"{table}.csv")
    with open(path + ".tmp", "w") as f:
        f.write(header_of(table) + "\n")
        for line in lines:
            f.write(line + "\n")
    os.replace(path + ".tmp", path)


def generate(out_dir: str, displays: int = 2000, seed: int = 0) -> list[str]:
    """Write the eight tables under ``out_dir``; returns their paths."""
    if displays < 1:
        raise ValueError("--displays must be >= 1")
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    n_docs = displays // 2 + 100
    n_sources = n_docs // 10 + 5
    n_ads = displays // 3 + 20
    n_campaigns = n_ads // 4 + 3
    n_users = int(displays * 0.8) + 5
    n_entities = n_docs // 2 + 10
    categories = np.sort(rng.choice(np.arange(1000, 2101), size=97, replace=False))

    # documents: meta, categories (weighted by confidence), topics, entities
    source_of_doc = _Zipf(rng, n_sources)(n_docs) + 1
    publisher_of_source = rng.integers(1, max(2, n_sources // 3), size=n_sources + 1)
    category_draw, topic_draw, entity_draw = _Zipf(rng, len(categories)), _Zipf(rng, 300), _Zipf(rng, n_entities)
    doc_cats = {}
    meta, cats, topics, ents = [], [], [], []
    for doc in range(1, n_docs + 1):
        src = source_of_doc[doc - 1]
        missing_src = rng.random() < 0.03
        pub = "" if missing_src or rng.random() < 0.05 else str(publisher_of_source[src])
        days_before = int(rng.exponential(60))
        when = "" if rng.random() < 0.1 else str(np.datetime64("2016-06-14T00:00:00") -
                                                 np.timedelta64(days_before * 86400 + int(rng.integers(86400)), "s"))
        meta.append(f"{doc},{'' if missing_src else src},{pub},{when.replace('T', ' ')}")
        main = categories[category_draw(1)[0]]
        doc_cats[doc] = {main}
        cats.append(f"{doc},{main},{rng.uniform(0.8, 0.95):.2f}")
        if rng.random() < 0.6:
            second = categories[rng.integers(len(categories))]
            if second != main:
                doc_cats[doc].add(second)
                cats.append(f"{doc},{second},{rng.uniform(0.05, 0.2):.2f}")
        for topic in np.unique(topic_draw(int(rng.integers(0, 9)))):
            topics.append(f"{doc},{topic},{rng.uniform(0.008, 0.3):.6f}")
        for ent in np.unique(entity_draw(int(rng.integers(0, 7)))):
            ents.append(f"{doc},{_entity_hash(seed, ent)},{rng.uniform(0.1, 0.9):.6f}")
    _write(out_dir, "documents_meta", meta)
    _write(out_dir, "documents_categories", cats)
    _write(out_dir, "documents_topics", topics)
    _write(out_dir, "documents_entities", ents)

    # promoted content: each ad promotes a document in a campaign of an advertiser
    doc_draw = _Zipf(rng, n_docs)
    ad_doc = doc_draw(n_ads) + 1
    ad_campaign = _Zipf(rng, n_campaigns)(n_ads) + 1
    advertiser_of_campaign = rng.integers(1, max(2, n_campaigns // 2), size=n_campaigns + 1)
    _write(out_dir, "promoted_content",
           (f"{ad},{ad_doc[ad - 1]},{ad_campaign[ad - 1]},{advertiser_of_campaign[ad_campaign[ad - 1]]}"
            for ad in range(1, n_ads + 1)))
    ad_quality = rng.normal(0, 1, size=n_ads + 1)

    # events: display ids grow with time over DAYS days; one in eleven is a Kaggle "test" display
    # (in events.csv but not in clicks_train), as in the real tables
    n_events = displays + displays // 10
    ts = np.sort(rng.integers(0, DAYS * DAY_MS, size=n_events))
    user_ids = [f"{x:014x}" for x in rng.integers(0, 2**56, size=n_users)]
    user_draw = _Zipf(rng, n_users, a=0.8)
    event_user = user_draw(n_events)
    event_doc = doc_draw(n_events) + 1
    platform = rng.choice(["1", "2", "3", "\\N"], size=n_events, p=[0.39, 0.47, 0.1399, 0.0001])
    geo = [_geo(rng) for _ in range(n_events)]
    _write(out_dir, "events", (f"{d + 1},{user_ids[event_user[d]]},{event_doc[d]},{ts[d]},{platform[d]},{geo[d]}"
                               for d in range(n_events)))

    # clicks: 2-12 popular ads per display, exactly one clicked
    ad_draw = _Zipf(rng, n_ads)
    clicks = []
    for d in np.sort(rng.choice(n_events, size=displays, replace=False)):
        k = int(np.clip(rng.poisson(4.2) + 2, 2, min(12, n_ads)))
        ads = np.array(list(dict.fromkeys((ad_draw(3 * k) + 1).tolist()))[:k])  # popular first
        while len(ads) < 2:
            ads = np.unique(np.append(ads, rng.integers(1, n_ads + 1)))
        overlap = np.array([len(doc_cats[event_doc[d]] & doc_cats[ad_doc[a - 1]]) for a in ads])
        score = np.exp(ad_quality[ads] + 1.5 * overlap)
        clicked = ads[rng.choice(len(ads), p=score / score.sum())]
        clicks += [f"{d + 1},{a},{int(a == clicked)}" for a in ads]
    _write(out_dir, "clicks_train", clicks)

    # page views: every event's page view plus background views
    extra = displays * 2
    pv_user = np.concatenate([event_user, user_draw(extra)])
    pv_doc = np.concatenate([event_doc, doc_draw(extra) + 1])
    pv_ts = np.concatenate([np.maximum(ts - rng.integers(0, 60_000, size=n_events), 0),
                            rng.integers(0, DAYS * DAY_MS, size=extra)])
    pv_platform = rng.choice(["1", "2", "3"], size=len(pv_user), p=[0.39, 0.47, 0.14])
    pv_source = rng.choice(["1", "2", "3"], size=len(pv_user), p=[0.7, 0.2, 0.1])
    _write(out_dir, "page_views", (f"{user_ids[pv_user[i]]},{pv_doc[i]},{pv_ts[i]},{pv_platform[i]},"
                                   f"{_geo(rng)},{pv_source[i]}" for i in range(len(pv_user))))
    return [os.path.join(out_dir, f"{t}.csv") for t in TABLES]


def _entity_hash(seed: int, ent: int) -> str:
    """A stable 32-hex-digit entity id (the real ids look like md5 digests)."""
    return f"{(int(ent) * 0x9E3779B97F4A7C15 * 0x2545F4914F6CDD1D + seed) % 2**128:032x}"


def _geo(rng) -> str:
    """'US>CA>807' style location; sometimes only the country, sometimes missing."""
    r = rng.random()
    if r < 0.01:
        return ""
    country = COUNTRIES[min(int(rng.zipf(1.6)) - 1, len(COUNTRIES) - 1)]
    if country != "US":
        return country if r < 0.5 else f"{country}>{int(rng.integers(1, 60)):02d}"
    return f"US>{US_STATES[min(int(rng.zipf(1.5)) - 1, len(US_STATES) - 1)]}>{int(rng.integers(500, 882))}"
