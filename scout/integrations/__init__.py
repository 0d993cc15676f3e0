"""Framework integrations (docs/integrations.md): scout switched on from a framework's own
extension points."""
