"""RunPod: REST v1 pods for create/refresh/destroy, GraphQL for GPU prices."""
