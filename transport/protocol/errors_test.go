package protocol

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorText(t *testing.T) {
	for _, tc := range []struct {
		err  *Error
		want string
	}{
		{&Error{Code: 17, Remark: "No topic route info in name server for the topic: T"}, "rocketmq: CODE 17 TOPIC_NOT_EXIST: No topic route info in name server for the topic: T"},
		{&Error{Code: 2}, "rocketmq: CODE 2 SYSTEM_BUSY"},
		{&Error{Code: 4242, Remark: "odd"}, "rocketmq: CODE 4242: odd"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got %q want %q", got, tc.want)
		}
	}
}

func TestResponseError(t *testing.T) {
	ok := NewResponse(NewRequest(ReqSendMessage), ResSuccess, "")
	if err := ResponseError(ok); err != nil {
		t.Fatalf("success gave %v", err)
	}
	frame, err := NewResponse(NewRequest(ReqGetRouteInfoByTopic), ResTopicNotExist, "no route").AppendFrame(nil, SerializeJSON)
	if err != nil {
		t.Fatal(err)
	}
	buf := frame[4:]
	c, err := DecodeFrame(buf)
	if err != nil {
		t.Fatal(err)
	}
	err = ResponseError(c)
	clear(buf) // the error must not alias the frame
	wrapped := fmt.Errorf("route of T: %w", err)
	if !errors.Is(wrapped, ErrTopicNotExist) || errors.Is(wrapped, ErrSystemError) {
		t.Fatalf("errors.Is wrong for %v", wrapped)
	}
	var e *Error
	if !errors.As(wrapped, &e) || e.Code != ResTopicNotExist || e.Remark != "no route" {
		t.Fatalf("errors.As gave %+v", e)
	}
	if errors.Is(ErrTopicNotExist, errors.New("x")) {
		t.Fatal("matched a foreign error")
	}
}

func TestIsRetryable(t *testing.T) {
	for code, want := range map[int32]bool{
		ResTopicNotExist: true, ResServiceNotAvailable: true, ResSystemError: true, ResNoPermission: true,
		ResSystemBusy: true, ResGoAway: true,
		ResMessageIllegal: false, ResInvalidParameter: false, ResPullNotFound: false, ResSubscriptionGroupNotExist: false,
	} {
		err := fmt.Errorf("send: %w", &Error{Code: code, Remark: "r"})
		if got := IsRetryable(err); got != want {
			t.Errorf("IsRetryable(code %d) = %v", code, got)
		}
	}
	if IsRetryable(errors.New("plain")) || IsRetryable(nil) {
		t.Error("non-protocol errors are retryable")
	}
}
