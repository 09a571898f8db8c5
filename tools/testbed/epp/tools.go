//go:build tools

// Package tools pins the endpoint picker's command so that `go mod tidy` keeps its dependencies in go.sum.
package tools

import _ "sigs.k8s.io/gateway-api-inference-extension/cmd/epp"
