// Package logging sets up structured JSON logs for every Lace binary and
// routes controller-runtime's and client-go's logs through the same handler.
package logging

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
)

// Setup installs a JSON slog handler on stderr at level as the default
// logger for slog, controller-runtime and klog.
func Setup(level string) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return fmt.Errorf("log level %q: %w", level, err)
	}
	h := slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})
	slog.SetDefault(slog.New(h))
	lr := logr.FromSlogHandler(h)
	ctrl.SetLogger(lr)
	klog.SetLogger(lr)
	return nil
}
