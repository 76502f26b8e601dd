"""Cluster profiles: validated YAML of a cluster's scheduler, node type and job settings.

Data only (the profile types, their schema, the node topology and the rank binding it implies);
loading a profile imports nothing of the execution layer (planning, backends, runs), which a
test checks. The names a program uses are re-exported here.
"""

from .loader import builtin_dir, list_profiles, load_profile, search_path
from .profile import Container, Profile, ProfileRef
from .schema import ProfileError

__all__ = ["Container", "Profile", "ProfileRef", "ProfileError", "builtin_dir", "list_profiles", "load_profile",
           "search_path"]
