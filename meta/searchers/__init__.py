"""ES searchers behind one ask/tell interface (see base.py)."""
from meta.searchers.base import Searcher, build_searcher, check_population, searcher_class

__all__ = ["Searcher", "build_searcher", "check_population", "searcher_class"]
