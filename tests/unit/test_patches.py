"""specpilot.patches: which files a candidate's patch names, and which it may change."""

import pytest

from specpilot import patches

EDIT = """diff --git a/engine/trees.py b/engine/trees.py
index 1111111..2222222 100644
--- a/engine/trees.py
+++ b/engine/trees.py
@@ -1,3 +1,3 @@
 x = 1
--- services/controller/pairing.py
-y = 2
+++ services/controller/pairing.py
"""


def test_hunk_bodies_are_not_read_as_headers():
    # the removed line "-- services/..." and the added "++ services/..." look like headers
    assert patches.check(EDIT) == ["engine/trees.py"]


def test_plain_unified_diff_and_new_and_deleted_files():
    text = ("--- a/kernels/k.py\t2024-01-01\n+++ b/kernels/k.py\t2024-01-02\n@@ -1 +1 @@\n-a\n+b\n"
            "diff --git a/engine/new.py b/engine/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/engine/new.py\n"
            "@@ -0,0 +1 @@\n+z = 1\n"
            "diff --git a/engine/old.py b/engine/old.py\ndeleted file mode 100644\n--- a/engine/old.py\n+++ /dev/null\n"
            "@@ -1 +0,0 @@\n-q = 0\n")
    assert patches.check(text) == ["kernels/k.py", "engine/new.py", "engine/old.py"]
    assert patches.check("") == []


@pytest.mark.parametrize("text, path", [
    ("diff --git a/services/controller/x.py b/services/controller/x.py\nnew file mode 100644\n"
     "index 0000000..e69de29\n", "services/controller/x.py"),  # empty new file: only the git header names it
    ("--- a/engine/a.py\n+++ b/tests/a.py\n@@ -1 +1 @@\n-a\n+b\n", "tests/a.py"),
    ("--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-a\n+b\n", "setup.py"),
    ("--- a/engine/../services/x.py\n+++ b/engine/../services/x.py\n@@ -1 +1 @@\n-a\n+b\n", "engine/../services/x.py"),
    ("--- a//etc/passwd\n+++ b//etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "/etc/passwd"),
    ("--- a/engine/.git/config\n+++ b/engine/.git/config\n@@ -1 +1 @@\n-a\n+b\n", "engine/.git/config"),
    ("--- a/zoo/x.py\n+++ b/zoo/x.py\n@@ -1 +1 @@\n-a\n+b\n", "zoo/x.py"),
    ("--- a/specpilot/entrypoints/cli.py\n+++ b/specpilot/entrypoints/cli.py\n@@ -1 +1 @@\n-a\n+b\n", "specpilot/entrypoints/cli.py"),
])
def test_paths_outside_engine_and_kernels_are_refused(text, path):
    with pytest.raises(patches.PatchRefused) as e:
        patches.check(text)
    assert e.value.path == path and path in str(e.value)


@pytest.mark.parametrize("text, what", [
    ("diff --git a/engine/a.py b/engine/b.py\nsimilarity index 100%\nrename from engine/a.py\nrename to engine/b.py\n",
     "two different names"),
    ("diff --git a/engine/a.py b/engine/a.py\nsimilarity index 90%\n", "rename or copy"),
    ("diff --git a/engine/w.bin b/engine/w.bin\nindex 1..2 100644\nGIT binary patch\nliteral 3\nKcmZ?l\n", "binary"),
    ("diff --git a/engine/w.bin b/engine/w.bin\nindex 1..2 100644\nBinary files a/engine/w.bin and b/engine/w.bin differ\n",
     "binary"),
    ("diff --git a/engine/l.py b/engine/l.py\nnew file mode 120000\n--- /dev/null\n+++ b/engine/l.py\n"
     "@@ -0,0 +1 @@\n+../services/x.py\n\\ No newline at end of file\n", "symlink"),
    ("diff --git a/engine/sub b/engine/sub\nnew file mode 160000\n", "submodule"),
    ('diff --git "a/engine/\\303\\251.py" "b/engine/\\303\\251.py"\n', "quoted"),
])
def test_tricks_are_refused(text, what):
    with pytest.raises(patches.PatchRefused, match=what):
        patches.check(text)
