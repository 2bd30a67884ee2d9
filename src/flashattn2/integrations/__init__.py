"""Integrations with other libraries, each an optional import: `import flashattn2.integrations.transformers`."""
