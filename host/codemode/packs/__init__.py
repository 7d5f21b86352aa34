"""Pack support: the pack protocol and loading (``loading``), a pack's lifecycle (``lifecycle``), both
re-exported here; the decorator form (``registry``), JSON Schema to shapes (``jsonschema``) and the
rules upstream packs share (``upstream``). See docs/packs.md."""

from .lifecycle import Lifecycle, LoadedPack, PackOpenError
from .loading import Pack, PackError, PackSettings, load_pack, load_packs, pack_capabilities, split_specs

__all__ = [
    "Lifecycle",
    "LoadedPack",
    "Pack",
    "PackError",
    "PackOpenError",
    "PackSettings",
    "load_pack",
    "load_packs",
    "pack_capabilities",
    "split_specs",
]
