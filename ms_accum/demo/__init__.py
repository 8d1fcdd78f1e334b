"""The MNIST application the CLI and the tutorials run: data, the demo networks, evaluation."""
