"""Cloud catalog: GPU offers with real prices (and, with the placement engine, supply and transfer costs)."""

from sailor_tasks.catalog.offers import Catalog, load_catalog, packaged_choices, read_offers

__all__ = ["Catalog", "load_catalog", "packaged_choices", "read_offers"]
