"""A plugin that fails while loading, as a plugin with a missing dependency does."""

raise RuntimeError("the sample plugin is broken on purpose")
