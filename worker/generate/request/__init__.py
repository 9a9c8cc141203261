"""The request stage: the model folder, its files' checks, its configs, the fleet's limits."""
