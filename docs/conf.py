"""Sphinx configuration of the timeouts documentation (built by bin/docs)."""

import os
import re
import sys
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# autodoc imports timeouts.models, which needs Django's app registry. The demo project's settings
# are enough: nothing here connects to a database or a broker.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django.setup()

from django.db.models import Model  # noqa: E402  needs the settings above

import timeouts  # noqa: E402

project = "timeouts"
author = "the timeouts authors"
copyright = "the timeouts authors"
release = timeouts.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
smartquotes = False  # code in docstrings keeps its straight quotes

# The package's docstrings are written for `help()` and editors: `name` means code, and character
# classes such as [A-Za-z0-9_.:-] appear as they are. Read them that way.
default_role = "literal"
LIST_ITEM = re.compile(r"([-*+]|\d+\.) ")
CHARACTER_CLASS = re.compile(r"(?<!`)(\[[^\]\s`]+\])(?!`)")


def indent(line):
    return len(line) - len(line.lstrip())


def read_docstring_as_written(app, what, name, obj, options, lines):
    """Character classes as literals, an indented block after a paragraph as a code block, and no
    Django-generated model docstring (it lists every field)."""
    if what == "class" and isinstance(obj, type) and issubclass(obj, Model) and lines[:1] == [obj.__doc__]:
        lines[:] = []
        return
    text = [CHARACTER_CLASS.sub(r"``\1``", line) for line in lines]
    out = []
    for i, line in enumerate(text):
        previous = next((p for p in reversed(text[:i]) if p.strip()), None)
        if (line.strip() and i and not text[i - 1].strip() and previous is not None
                and indent(line) > indent(previous) and not previous.rstrip().endswith("::")
                and not LIST_ITEM.match(line.lstrip()) and not LIST_ITEM.match(previous.lstrip())
                and (not out or out[-1].strip() != "::")):
            out[-1:] = ["", "::", ""]
        out.append(line)
    lines[:] = out


def model_signature(app, what, name, obj, options, signature, return_annotation):
    if what == "class" and isinstance(obj, type) and issubclass(obj, Model):
        return "", None
    return None


def setup(app):
    app.connect("autodoc-process-docstring", read_docstring_as_written)
    app.connect("autodoc-process-signature", model_signature)


html_theme = "furo"
html_title = "timeouts"
html_static_path = []
# No intersphinx: the build never touches the network.
