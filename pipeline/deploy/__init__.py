"""Deployments of a packaged model: one kind per subpackage, behind one interface (pipeline.deploy.base).

    deployer = deployer_for(spec.deploy.kind)      pipeline.deploy.registry
    deployer.render(spec, inputs, out_dir)        write the deployment directory
    deployer.check(directory)                     its problems, as the kind's own tools would read it
    deployer.export(source, destination)          copy it out of the artifact store (e.g. to ./deploy)
    deployer.start_command(spec, directory)       how to start it; deployer.up(spec, directory) starts it

Kinds: compose (pipeline.deploy.compose: docker compose with Triton, Prometheus and Grafana) and kubernetes
(pipeline.deploy.kubernetes: manifests with a kustomize base and overlays).
Shared by every kind: layout (container paths, ports, services, secrets), images, dockerfile and
image_setup (the cpu image), server_command (what the services run), monitoring (Prometheus and
Grafana configuration), rules and rule_tests (Prometheus rules and their promtool test) and files (what every
deployment directory holds).
"""
