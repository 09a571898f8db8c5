// Command kstatus prints what kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status, the library Flux, kpt and
// the cli-utils applier judge resources with) computes for each resource it reads: status.Compute, not a
// re-implementation. Built by e2e/kstatus-build.sh at the version go.mod pins; called by e2e/kstatus.py.
//
// Input on stdin: one JSON object, a stream of them, or a JSON array of them (each with apiVersion and kind,
// as the API returns it). Output on stdout: a JSON array, one {"status", "message"} per object, in order.
// An object kstatus cannot judge (status.Compute returns an error) fails the run: exit code 1, the error on
// stderr. `kstatus -version` prints the cli-utils version it was built with.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

const cliUtils = "sigs.k8s.io/cli-utils"

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

// documents splits stdin into raw JSON objects: the elements of a top-level array, or each object of a stream.
func documents(r io.Reader) ([]json.RawMessage, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var docs []json.RawMessage
		if err := json.Unmarshal(trimmed, &docs); err != nil {
			return nil, err
		}
		return docs, nil
	}
	var docs []json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	for {
		var doc json.RawMessage
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return docs, nil
		} else if err != nil {
			return nil, err
		}
		docs = append(docs, doc)
	}
}

func version() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == cliUtils {
				return dep.Version
			}
		}
	}
	return "unknown"
}

func run() error {
	showVersion := flag.Bool("version", false, "print the "+cliUtils+" version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version())
		return nil
	}
	docs, err := documents(os.Stdin)
	if err != nil {
		return fmt.Errorf("reading the resources on stdin: %w", err)
	}
	out := make([]verdict, 0, len(docs))
	for i, doc := range docs {
		u := &unstructured.Unstructured{}
		// Unstructured's own decoding, as client-go's: integers become int64, which status.Compute requires.
		if err := u.UnmarshalJSON(doc); err != nil {
			return fmt.Errorf("resource %d: %w", i, err)
		}
		res, err := status.Compute(u)
		if err != nil {
			return fmt.Errorf("resource %d (%s %s): kstatus: %w", i, u.GetKind(), u.GetName(), err)
		}
		out = append(out, verdict{Status: res.Status.String(), Message: res.Message})
	}
	w := bufio.NewWriter(os.Stdout)
	if err := json.NewEncoder(w).Encode(out); err != nil {
		return err
	}
	return w.Flush()
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kstatus:", err)
		os.Exit(1)
	}
}
