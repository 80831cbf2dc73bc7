// Package deploy holds no code of wsproxy's: its tests check what deploy/ ships for running
// wsproxy on Kubernetes and watching it, without a cluster — the Helm chart (helm/wsproxy),
// rendered with the pinned Helm library for its default values and a production example and
// decoded strictly into the Kubernetes API types; its alert rules, run by promtool against their
// unit tests; and every PromQL expression of the rules and the Grafana dashboard
// (helm/wsproxy/files), parsed with Prometheus's parser and checked against the /metrics of a
// running wsproxy. It is a module of its own so that wsproxy's takes on none of Helm's,
// Kubernetes' or Prometheus's dependencies.
package deploy
