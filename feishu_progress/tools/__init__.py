"""Pure tool-call semantics: summaries with failure reasons, input previews, rich-view parsers."""
