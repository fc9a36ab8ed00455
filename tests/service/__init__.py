"""The service tier: real gRPC servers, server and worker processes, Ray, Prometheus, S3."""
