package agent

import "sigs.k8s.io/controller-runtime/pkg/config"

func ctrlConfig(o Options) config.Controller {
	skip := o.SkipNameValidation
	return config.Controller{SkipNameValidation: &skip}
}
