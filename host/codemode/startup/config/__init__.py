"""The one settings model of codemode: every front end (``serve --stdio``, ``serve --http``,
``quotas tune``, ``bench``) reads its configuration through :func:`load_settings`.

Precedence, highest first: keyword overrides (what the CLI passes for the flags given on its command
line), ``CODEMODE_*`` environment variables, the TOML file named by ``--config`` / ``CODEMODE_CONFIG``,
then the defaults. A setting's facts (its kind, the mode it applies to, its flag group) live in its
field's metadata (:func:`setting`); the flags, variables, TOML keys and the docs table are generated
from them (:func:`leaves`). Each setting's environment name is its name upper-cased with the
``CODEMODE_`` prefix, and its flag is the name with ``-`` for ``_`` (``pool`` → ``--pool`` /
``CODEMODE_POOL``); :func:`names` gives both, and every :class:`ConfigError` names them. A
runtime's settings are a nested table (``settings.docker.memory``, ``[docker]`` in TOML) whose flat
names are ``--docker-memory`` / ``CODEMODE_DOCKER_MEMORY`` / ``docker_memory``. Limits may also be
written as a ``[limits]`` table in TOML. List settings accept JSON (``["a:b", "c:d"]``) or a
comma-separated string in the environment.

One setting holds a secret: ``store`` when it is a PostgreSQL URI with a password. It is kept out
of the settings' repr, no error quotes it, and the store names its server by host, port and
database only. Everything else here is public: the token file holds SHA-256 hashes only, JWKS are
public keys.
"""

from __future__ import annotations

from .facts import ENV_PREFIX, Facts, Leaf, facts, parse_size, setting
from .fields import StrList
from .load import OTHER_VARIABLES, load_settings, misspelled_variables
from .model import Settings, leaves
from .naming import CONFIG_ENV, ConfigError, env_var, flag, names
from .places import POD_NAMESPACE_FILE, default_data_dir, default_token_file
from .tables import DockerTable, KubernetesTable, ProcessTable

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "OTHER_VARIABLES",
    "POD_NAMESPACE_FILE",
    "ConfigError",
    "DockerTable",
    "Facts",
    "KubernetesTable",
    "Leaf",
    "ProcessTable",
    "Settings",
    "StrList",
    "default_data_dir",
    "default_token_file",
    "env_var",
    "facts",
    "flag",
    "leaves",
    "load_settings",
    "misspelled_variables",
    "names",
    "parse_size",
    "setting",
]
