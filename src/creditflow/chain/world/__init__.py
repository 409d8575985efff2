"""The chain's world: the seeded short-video catalogue, its click-biased search logs and the
simulator's users (``catalogue``), the MovieLens sessions and teacher (``movielens``), and a
researcher's own items and impressions read as the same tables (``sources``)."""
