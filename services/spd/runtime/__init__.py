"""The distributed runtime: stage, drafter and orchestrator processes around the pure core."""
