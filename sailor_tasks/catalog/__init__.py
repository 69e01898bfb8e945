"""Cloud catalog: GPU offers with real prices (and, with the placement engine, supply and transfer costs)."""

from sailor_tasks.catalog.offers import Catalog, catalog_choices, load_catalog, read_offers

__all__ = ["Catalog", "catalog_choices", "load_catalog", "read_offers"]
