// Package v20170312 stands in for Tencent Cloud's VPC SDK, which the Go
// module proxy does not serve. flannel's main links every backend; the
// lab runs only vxlan, so the tencentvpc backend only needs to compile.
// Every call fails.
package v20170312

import "errors"

var errNotBuilt = errors.New("the tencentvpc backend is not built into the lab's flanneld")

type Client struct{}

func NewClientWithSecretId(id, key, region string) (*Client, error) { return nil, errNotBuilt }

type Filter struct {
	Name   *string
	Values []*string
}

type Route struct {
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteType            *string
	Enabled              *bool
	RouteId              *uint64
}

type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

type DescribeRouteTablesRequest struct{ Filters []*Filter }

type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

type DeleteRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

type CreateRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest {
	return &DescribeRouteTablesRequest{}
}
func NewDeleteRoutesRequest() *DeleteRoutesRequest { return &DeleteRoutesRequest{} }
func NewCreateRoutesRequest() *CreateRoutesRequest { return &CreateRoutesRequest{} }

func (*Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, errNotBuilt
}
func (*Client) DeleteRoutes(*DeleteRoutesRequest) (struct{}, error) { return struct{}{}, errNotBuilt }
func (*Client) CreateRoutes(*CreateRoutesRequest) (struct{}, error) { return struct{}{}, errNotBuilt }
