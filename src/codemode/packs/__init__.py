"""Pack support: the pack protocol and loading (``loading``, re-exported here), the decorator form
(``registry``), JSON Schema to shapes (``jsonschema``) and the rules upstream packs share
(``upstream``). See docs/packs.md."""

from .loading import Pack, PackError, PackSettings, load_pack, load_packs, pack_capabilities, split_specs

__all__ = ["Pack", "PackError", "PackSettings", "load_pack", "load_packs", "pack_capabilities", "split_specs"]
