"""A store's URL as messages show it: any password masked."""

from __future__ import annotations

import re


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***``: in the user-info part (which
    ends at the last ``@`` before the path, as redis-py parses it) and in a
    ``password=`` query option (which redis-py honours too)."""
    url = re.sub(r"(://[^:/?#]*:)[^/?#]*@", r"\1***@", url)
    return re.sub(r"([?&]\w*password=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)
