"""What a folder holds, byte for byte, to show that a program left it as it was."""

from __future__ import annotations

import os


def snapshot(folder) -> dict[str, object]:
    """Every path under `folder` (links not followed) with its bytes, a link's target or
    "folder"; the folder itself too, so that a folder removed or made differs."""
    found: dict[str, object] = {}
    folder = str(folder)
    if not os.path.lexists(folder):
        return found
    found["."] = "folder" if os.path.isdir(folder) else open(folder, "rb").read()
    for top, folders, names in os.walk(folder):
        for name in folders + names:
            path = os.path.join(top, name)
            relative = os.path.relpath(path, folder)
            if os.path.islink(path):
                found[relative] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                found[relative] = "folder"
            else:
                with open(path, "rb") as f:
                    found[relative] = f.read()
    return found
