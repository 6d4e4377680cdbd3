"""Kubernetes deployment of an SPD pipeline: manifests rendered from a config (render), and a deploy
tool on the `kubernetes` Python client (deploy: apply, status, delete, chaos). `spd k8s ...`."""
