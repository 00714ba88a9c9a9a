"""The searchers' one name for their search radius, ``es.radius``.

Why one name: the per-coordinate spread of a searcher's samples is the one setting every searcher has and the pilot
scans; under a name per searcher (pgpe's ``stdev_init``, cmaes's ``sigma_init``, openai_es_elite's ``sigma``...) each
YAML selected it from a root ``search_radius`` and the pilot looked it up per class. Now every searcher takes
``radius`` and maps it to its own algorithm's argument; conf/config.yaml holds its one default. A search stored under
the former names reads under this one through the stored config's upgrade (meta/settings/upgrade.py).
"""
from __future__ import annotations

#: the es key of every searcher's search radius
RADIUS_KEY = "radius"
